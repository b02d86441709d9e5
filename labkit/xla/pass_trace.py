"""Which XLA passes changed a compiled module, read from XLA's per-pass dumps.

``xla_dump_to`` + ``xla_dump_hlo_pass_re=.*`` make XLA write the module after each pass that
changed it; :func:`traced` compiles with them in a temporary folder (removed before it
returns) and reads the files back in the order XLA ran the passes, as a :class:`PassTrace`.
A compile that dumps files is never served from the kit's compile cache.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from labkit.xla import hlo

# A per-pass dump is named module_<id>.<module>.<n>.<pipeline>.after_<pass>.before_<next>.txt
PASS_FILE = re.compile(
    r"module_\d+\.(?P<module>[^.]+)\.(?P<n>\d+)\.(?P<pipeline>[^.]+)"
    r"\.after_(?P<after>[^.]+)\.before_(?P<before>[^.]+)\.txt"
)


@dataclasses.dataclass(frozen=True)
class PassTrace:
    """The HLO passes that changed one compiled module, in the order XLA ran them.

    ``steps`` are ``(pipeline, pass)`` pairs and ``texts`` the module each left. Read from
    ``xla_dump_to`` + ``xla_dump_hlo_pass_re``: XLA writes the module after each pass that
    changed it, so a pass that changed nothing is absent. A pipeline that a pass runs inside
    itself (``spmd-cleanup`` inside ``spmd-partitioning``) is dumped before that pass is.
    """

    steps: list[tuple[str, str]]
    texts: list[str]

    def passes(self, pipeline: str) -> list[str]:
        """The passes of one pipeline (``"spmd-partitioner"``, ...) that changed the module."""
        return [name for pipe, name in self.steps if pipe == pipeline and name != "pipeline-start"]

    def after(self, name: str) -> str:
        """The module as the first run of pass ``name`` left it."""
        for (_, ran), text in zip(self.steps, self.texts, strict=True):
            if ran == name:
                return text
        raise KeyError(f"pass {name!r} did not change this module; ran: {self.steps}")

    def first(self, kind: str) -> tuple[str, str]:
        """``(pipeline, pass)`` of the first pass after which the module holds a ``kind``
        collective (``"all-reduce"``, ``"reduce-scatter"``, ...)."""
        for step, text in zip(self.steps, self.texts, strict=True):
            if kind in hlo.collective_counts(text):
                return step
        raise KeyError(f"no pass made a {kind}")


def traced[T](compile_with: Callable[[dict[str, str]], T], module: str) -> tuple[T, PassTrace]:
    """Run ``compile_with(options)`` with XLA's per-pass dumps in a temporary folder (removed
    before returning): its result, and which passes changed ``module`` (``jit_<name>``)."""
    with tempfile.TemporaryDirectory(prefix="labkit-passes-") as folder:
        result = compile_with({"xla_dump_to": folder, "xla_dump_hlo_pass_re": ".*"})
        found = sorted(
            (int(m["n"]), m["pipeline"], m["after"], path)
            for path in Path(folder).iterdir()
            if (m := PASS_FILE.fullmatch(path.name)) and m["module"] == module
        )
        if not found:
            raise ValueError(f"no per-pass dump of module {module!r}: pass module= its name")
        steps = [(pipe, after) for _, pipe, after, _ in found]
        return result, PassTrace(steps, [path.read_text() for *_, path in found])
