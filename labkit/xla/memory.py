"""Memory as the compiler sees it: ``compiled.memory_analysis()`` for one device, as plain data.

XLA's buffer assignment decides, per device, how many bytes the program's arguments, outputs
and temporaries take, and which outputs reuse (alias) a donated argument. A deviceless H100
compile reports the same analysis as a real one: it is computed from the compiled program,
not measured. ``peak`` is XLA's own figure for the most bytes live at once; without it,
``argument + output - alias + temp`` bounds it from above. :func:`picture` draws programs'
memory as stacked bars against an H100's memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

from labkit.core.figures import Picture, stacked_bars
from labkit.core.hardware import hardware

if TYPE_CHECKING:
    from jax.stages import Compiled

    from labkit.xla.compile_cache import StoredCompile

__all__ = ["Memory", "memory", "picture"]


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes per device of a compiled program (``compiled.memory_analysis()``)."""

    argument: int
    output: int
    alias: int  # outputs written over donated arguments: counted in both above
    temp: int  # activations, gradients in flight, workspaces
    code: int  # the generated code (0 for a deviceless GPU compile: it keeps no binary)
    peak: int | None  # XLA's peak of live bytes, where this jaxlib reports it

    @property
    def total(self) -> int:
        """``argument + output - alias + temp``: every byte the program holds, counted once."""
        return self.argument + self.output - self.alias + self.temp

    def parts(self) -> dict[str, int]:
        """The bytes of :attr:`total` in three parts: arguments, the outputs not written over
        a donated argument, and temporaries."""
        return {
            "arguments": self.argument,
            "outputs not in place": self.output - self.alias,
            "temporaries": self.temp,
        }

    def row(self, name: str) -> dict[str, str | float | None]:
        """A table row in MB (10^6 bytes), rounded to 0.01 MB."""
        fields = ("argument", "output", "alias", "temp")
        mb = {f"{k} MB": round(getattr(self, k) / 1e6, 2) for k in fields}
        peak = None if self.peak is None else round(self.peak / 1e6, 2)
        return {"program": name, **mb, "total MB": round(self.total / 1e6, 2), "peak MB": peak}


def memory(compiled: Compiled | StoredCompile) -> Memory:
    """The :class:`Memory` of a compiled executable (deviceless or not, or a stored compile)."""
    stats = compiled.memory_analysis()
    if stats is None:
        raise ValueError("this executable reports no memory analysis (an older jaxlib?)")

    def get(name: str) -> int:
        return int(getattr(stats, f"{name}_size_in_bytes", 0) or 0)

    peak = getattr(stats, "peak_memory_in_bytes", None)
    return Memory(
        get("argument"),
        get("output"),
        get("alias"),
        get("temp"),
        get("generated_code"),
        None if peak is None else int(peak),
    )


def picture(
    programs: Mapping[str, Memory],
    title: str,
    *,
    gpu: str = "H100 SXM",
    limits: Mapping[str, float] | None = None,
    note: str = "",
) -> Picture:
    """Each program's bytes per device, stacked by :meth:`Memory.parts`, against ``gpu``'s
    memory and any ``limits`` (``{"limit": bytes}``)."""
    hw = hardware(gpu)
    capacities = {f"{hw.name} {hw.memory_gb:g} GB": hw.memory_gb * 1e9, **(limits or {})}
    parts = {name: {k: float(v) for k, v in m.parts().items()} for name, m in programs.items()}
    return stacked_bars(title, parts, "program", capacities=capacities, note=note)
