"""What the kit reads from a deviceless GPU compile, kept on disk across processes.

A deviceless H100 compile of the tiny GPT step costs 10-15 s of CPU, and several lessons (and
their second run under nbval, and their solutions) compile the same programs. JAX's own
persistent cache does not help: a fresh process serves no deviceless executable from it. So
this cache keeps what the kit reads of a compile, not the executable: the optimized HLO text,
``memory_analysis()``, ``cost_analysis()`` and how long the compile took.
:func:`labkit.xla.aot.compile_for_gpu` serves a repeated compile from it as a
:class:`StoredCompile`, which answers those three calls with XLA's own earlier answers and
refuses everything else with a message saying so.

The key is everything that decides the compiled program: the lowered StableHLO (with its
shardings), the compile options, the target devices, the jax, jaxlib and CUDA plugin versions,
``XLA_FLAGS``, JAX's configuration, and the contents of any file an option names (a PGLE
profile, autotune results). XLA's kernel cache file is left out: it does not change the
program. A compile that dumps files (``xla_dump_*``) is never served from here, since its
reader wants the files, and neither is a compile with ``cache=False``. A program with a
Mosaic GPU kernel is never stored: jaxlib assembles such kernels for the first
GPU architecture the process compiled for, so the same key can give another program in
another process.

The folder is ``$LABKIT_CACHE_DIR/compiles`` (default ``~/.cache/labkit/compiles``);
``LABKIT_COMPILE_CACHE=off`` turns the cache off. Entries are written whole under a new name
and renamed into place, so processes that share the folder never read half an entry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from labkit.core.env import cache_dir

if TYPE_CHECKING:
    from jax import Device
    from jax.stages import Compiled, Lowered

__all__ = [
    "FORMAT",
    "IGNORED_OPTIONS",
    "MOSAIC_GPU_CALL",
    "StoredCompile",
    "cache_folder",
    "enabled",
    "key",
    "load",
    "read_entry",
    "served_stale",
    "storable",
    "store",
    "write_entry",
]

FORMAT = 1  # bump when what an entry holds changes
MOSAIC_GPU_CALL = 'custom_call_target="mosaic_gpu'  # a Pallas Mosaic GPU kernel in the HLO
# Per-compile options that leave the program as it is (and name a per-process file).
IGNORED_OPTIONS = frozenset({"xla_gpu_kernel_cache_file"})
_PACKAGES = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin")
_MEMORY_FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "alias_size_in_bytes",
    "temp_size_in_bytes",
    "generated_code_size_in_bytes",
    "peak_memory_in_bytes",
)


def enabled() -> bool:
    """Whether compiles may be served from disk (``LABKIT_COMPILE_CACHE=off`` says no)."""
    return os.environ.get("LABKIT_COMPILE_CACHE", "on").lower() not in ("off", "0", "false", "no")


def cache_folder() -> Path:
    """The folder of stored compiles (``$LABKIT_CACHE_DIR/compiles``)."""
    return cache_dir() / "compiles"


def _versions() -> dict[str, str]:
    found = {}
    for name in _PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _file_digest(path: Path) -> str:
    """A digest of a file, or of a folder's files and their names."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _option_value(value: object) -> object:
    """An option's value as it enters the key: a file or folder it names by its contents."""
    if isinstance(value, str) and value and os.path.exists(value):
        return {"path contents": _file_digest(Path(value))}
    return value if isinstance(value, bool | int | float | str) else repr(value)


def dumps_files(options: Mapping[str, object]) -> bool:
    """Whether a compile with these options (or this process's ``XLA_FLAGS``) writes dumps."""
    return any(str(k).startswith("xla_dump") for k in options) or "--xla_dump" in os.environ.get(
        "XLA_FLAGS", ""
    )


def key(lowered: Lowered, options: Mapping[str, object], devices: Sequence[Device]) -> str:
    """The digest naming a compile: everything that decides the program it gives."""
    import jax

    described = {
        "format": FORMAT,
        "stablehlo": hashlib.sha256(lowered.as_text().encode()).hexdigest(),
        "options": {
            str(k): _option_value(v)
            for k, v in sorted(options.items())
            if str(k) not in IGNORED_OPTIONS
        },
        "devices": sorted((d.id, d.process_index, d.platform, d.device_kind) for d in devices),
        "versions": _versions(),
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
        "jax config": {k: repr(v) for k, v in sorted(jax.config.values.items())},
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """``memory_analysis()`` of a stored compile: the fields jaxlib's own object has."""

    argument_size_in_bytes: int
    output_size_in_bytes: int
    alias_size_in_bytes: int
    temp_size_in_bytes: int
    generated_code_size_in_bytes: int
    peak_memory_in_bytes: int | None


@dataclasses.dataclass(frozen=True)
class StoredCompile:
    """A compile served from the cache: XLA's own text, memory and cost analyses of it.

    It answers ``as_text()``, ``memory_analysis()`` and ``cost_analysis()`` as the
    ``jax.stages.Compiled`` it was read from did; it holds no executable.
    """

    text: str
    memory: MemoryStats | None
    cost: dict[str, float]
    seconds: float  # how long XLA took when it compiled this program
    digest: str

    def as_text(self) -> str:
        """The optimized HLO text XLA gave (``Compiled.as_text()``)."""
        return self.text

    def memory_analysis(self) -> MemoryStats | None:
        """XLA's buffer sizes for one device (``Compiled.memory_analysis()``)."""
        return self.memory

    def cost_analysis(self) -> dict[str, float]:
        """XLA's cost analysis (``Compiled.cost_analysis()``; empty deviceless)."""
        return dict(self.cost)

    def __getattr__(self, name: str) -> NoReturn:
        raise AttributeError(
            f"this compile was served from labkit's compile cache ({cache_folder()}), which "
            f"keeps XLA's text, memory and cost analyses only, not {name!r}: compile with "
            "cache=False (labkit.xla.aot.compile_for_gpu) for the executable itself"
        )


def _entry(digest: str) -> Path:
    return cache_folder() / f"{digest}.json.z"


def write_entry(entry: Path, data: object) -> None:
    """Write ``data`` as compressed JSON to ``entry``, whole or not at all (a temporary file
    renamed over it, so a reader in another process never sees half); a disk error skips it."""
    tmp = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(zlib.compress(json.dumps(data).encode(), 3))
        os.replace(tmp, entry)
    except OSError:
        tmp.unlink(missing_ok=True)


def read_entry(entry: Path) -> Any:
    """What :func:`write_entry` wrote to ``entry``; raises OSError, ValueError or zlib.error
    when it is absent or unreadable."""
    return json.loads(zlib.decompress(entry.read_bytes()))


def load(digest: str) -> StoredCompile | None:
    """The stored compile named ``digest``, or None (absent, or unreadable: a miss)."""
    try:
        data = read_entry(_entry(digest))
        memory = data["memory"]
        return StoredCompile(
            data["hlo"],
            None if memory is None else MemoryStats(**memory),
            {str(k): float(v) for k, v in data["cost"].items()},
            float(data["seconds"]),
            digest,
        )
    except (OSError, ValueError, KeyError, TypeError, zlib.error):
        return None


def _memory_of(compiled: Compiled) -> dict[str, int | None] | None:
    stats = compiled.memory_analysis()
    if stats is None:
        return None
    out: dict[str, int | None] = {}
    for name in _MEMORY_FIELDS:
        value = getattr(stats, name, None)
        out[name] = None if value is None else int(value)
    for name in _MEMORY_FIELDS[:-1]:
        out[name] = out[name] or 0
    return out


def _cost_of(compiled: Compiled) -> dict[str, float]:
    analysis = compiled.cost_analysis()
    if isinstance(analysis, Sequence):  # older jaxlibs returned one dict per device
        analysis = analysis[0] if analysis else {}
    return {str(k): float(v) for k, v in (analysis or {}).items()}


def storable(text: str) -> bool:
    """Whether a compiled program may be stored: not if its result depends on the process."""
    return MOSAIC_GPU_CALL not in text


# Which key each XLA executable of this process was stored under (by the executable's id).
_STORED_AS: dict[int, str] = {}


def _executable_id(compiled: Compiled) -> int | None:
    """The id of jaxlib's executable inside ``compiled`` (JAX hands out the same one again
    when its in-process cache serves a compile), or None where jax keeps it elsewhere."""
    executable = getattr(getattr(compiled, "_executable", None), "xla_executable", None)
    return None if executable is None else id(executable)


def served_stale(digest: str, compiled: Compiled) -> bool:
    """Whether JAX's in-process cache handed out an executable compiled under another key.

    JAX keys its in-process cache on the lowered program and the compile options, not on
    every setting this cache's key holds (``jax_optimization_level``, for one): change such a
    setting between two compiles of one jitted function and JAX returns the first program.
    Stored under the second key, it would be served to a fresh process that would have
    compiled the second program; so it is not stored.
    """
    identity = _executable_id(compiled)
    if identity is None:
        return False
    return _STORED_AS.setdefault(identity, digest) != digest


def store(digest: str, compiled: Compiled, text: str, seconds: float) -> None:
    """Keep what the kit reads of ``compiled`` (and the ``seconds`` its compile took) under
    ``digest``; a full disk costs time only. Nothing is stored for a program with a Mosaic
    GPU kernel (:func:`storable`) or an executable JAX served stale (:func:`served_stale`)."""
    if not storable(text) or served_stale(digest, compiled):
        return
    data = {
        "hlo": text,
        "memory": _memory_of(compiled),
        "cost": _cost_of(compiled),
        "seconds": seconds,
    }
    write_entry(_entry(digest), data)
