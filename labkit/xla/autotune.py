"""XLA's autotune results from a real GPU, kept for deviceless compiles to load.

On a GPU, XLA's autotuner times candidate configs per GEMM fusion and can write what it
picked as one ``AutotuneResults`` text proto (``xla_gpu_dump_autotune_results_to``, with
``xla_gpu_use_new_autotune_cache_format=false`` for the legacy format this module reads):
``version: N`` then one ``results { device: "..." hlo: "..." result { ... } version: M }``
block per fusion. The ``device`` field is XLA's key string of the GPU that ran it; a real
H100's differs from the deviceless target's (measured bandwidth, the real cuDNN version
where a compile-only device says ``DNN version: 0.0.0``), so a dump is only found by a
deviceless compile once :func:`rewrite_device` has given every entry the deviceless string
(:func:`labkit.xla.tiles.device_for`).

:func:`write_folder` then lays the entries out as XLA's per-fusion cache folder holds them
(one ``AutotuneResult`` per key, named as :func:`labkit.xla.tiles.cache_file_name` names
it), the folder :func:`labkit.xla.tiles.compile_with_rule` hands XLA for the rule's configs:
the format is the same, so measured results replace the rule's without anything else
changing. :data:`STORE` is where ``labkit gpu-check`` keeps them in the repository, one
results file per preset and GPU, with a JSON record of the GPU, driver and jaxlib.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from labkit.xla.tiles import TileConfig, cache_file_name, device_for

__all__ = [
    "STORE",
    "DumpRecord",
    "Entry",
    "config_of",
    "dump_options",
    "parse_results",
    "rewrite_device",
    "stored",
    "write_folder",
    "write_stored",
]

STORE = Path(__file__).resolve().parent / "autotune_results"  # in the repository
_DEVICE = re.compile(r'^(\s*device:\s*)"((?:[^"\\]|\\.)*)"', re.M)
_STRING = r'"((?:[^"\\]|\\.)*)"'
_TRITON = re.compile(r"triton\s*\{([^}]*)\}")


def dump_options(path: str | Path) -> dict[str, str | bool]:
    """Per-compile options that make a GPU compile write its autotune results to ``path``
    in the legacy format (the one XLA's per-fusion folder and this module read)."""
    return {
        "xla_gpu_dump_autotune_results_to": str(path),
        "xla_gpu_use_new_autotune_cache_format": False,
    }


@dataclasses.dataclass(frozen=True)
class Entry:
    """One fusion's result: the GPU key string, the fusion as XLA keys it, the result."""

    device: str
    hlo: str  # the fusion's computation, as XLA prints it for its key (unescaped)
    result: str  # the text inside ``result { ... }``: ``triton { ... }``, ``gemm { ... }``
    version: int


def _blocks(text: str, name: str) -> Iterator[str]:
    """The bodies of the top-level ``name { ... }`` blocks of a text proto (strings skipped)."""
    i = 0
    opener = re.compile(rf"(?m)^\s*{name}\s*\{{")
    while m := opener.search(text, i):
        depth, j, quoted = 1, m.end(), False
        while depth and j < len(text):
            c = text[j]
            if quoted:
                if c == "\\":
                    j += 1
                elif c == '"':
                    quoted = False
            elif c == '"':
                quoted = True
            elif c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            j += 1
        if depth:
            raise ValueError(f"unbalanced braces in a {name} block: not an AutotuneResults file")
        yield text[m.end() : j - 1]
        i = j


def _unescape(text: str) -> str:
    """A text-proto string's escapes (C style: \\n, \\", octal) undone."""
    return codecs.escape_decode(text.encode())[0].decode()


def _field(block: str, name: str) -> str | None:
    m = re.search(rf"(?m)^\s*{name}:\s*{_STRING}", block)
    return None if m is None else _unescape(m.group(1))


def parse_results(text: str) -> list[Entry]:
    """The entries of an ``AutotuneResults`` text proto (legacy format); ValueError if none."""
    entries = []
    for block in _blocks(text, "results"):
        device, hlo = _field(block, "device"), _field(block, "hlo")
        (result,) = list(_blocks(block, "result")) or [""]
        version = re.findall(r"(?m)^\s*version:\s*(\d+)", block)
        if device is None or hlo is None or not result:
            raise ValueError("a results block without device, hlo or result: not XLA's format")
        entries.append(Entry(device, hlo, result.strip(), int(version[-1]) if version else 0))
    if not entries:
        raise ValueError(
            "no results blocks: not a legacy-format AutotuneResults file (dump it with "
            "labkit.xla.autotune.dump_options, which turns the new cache format off)"
        )
    return entries


def rewrite_device(text: str, kind: str) -> tuple[str, list[str]]:
    """``text`` with every entry's ``device`` made the deviceless ``kind``'s key string, and
    the device strings it had (what the real GPU called itself), in order, deduplicated."""
    model = json.dumps(device_for(kind).model)
    found: list[str] = []

    def swap(m: re.Match[str]) -> str:
        original = _unescape(m.group(2))
        if original not in found:
            found.append(original)
        return f"{m.group(1)}{model}"

    return _DEVICE.sub(swap, text), found


def config_of(entry: Entry) -> TileConfig | None:
    """The Triton tile config of an entry, or None where XLA picked another backend."""
    m = _TRITON.search(entry.result)
    if m is None:
        return None
    fields = dict(re.findall(r"(\w+):\s*(\d+)", m.group(1)))
    names = [f.name for f in dataclasses.fields(TileConfig)]
    return TileConfig(**{k: int(v) for k, v in fields.items() if k in names})


def write_folder(entries: Sequence[Entry], folder: Path, kind: str) -> list[Path]:
    """Write the entries as XLA's per-fusion cache folder for the deviceless ``kind``; the
    files written. Entries must carry that device's key string (:func:`rewrite_device`)."""
    device = device_for(kind)
    wrong = {e.device for e in entries} - {device.model}
    if wrong:
        raise ValueError(
            f"entries for {sorted(wrong)[0]!r}, not the deviceless {kind}: "
            "rewrite them first (labkit.xla.autotune.rewrite_device)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for entry in entries:
        path = folder / cache_file_name(device, entry.hlo)
        path.write_text(entry.result + "\n")  # an AutotuneResult, as the rule's files hold
        written.append(path)
    return written


@dataclasses.dataclass(frozen=True)
class DumpRecord:
    """Where a stored results file came from: the GPU, driver and jaxlib that timed it."""

    preset: str
    kind: str  # the deviceless target it was rewritten for (hardware-table name)
    gpu: str  # the GPU's name as nvidia-smi gives it
    driver: str
    jaxlib: str
    device_strings: list[str]  # the device strings XLA wrote before the rewrite
    entries: int
    triton_entries: int


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def write_stored(text: str, record: DumpRecord, store: Path = STORE) -> tuple[Path, Path]:
    """Keep a rewritten results file and its record in ``store``; their paths."""
    folder = store / _slug(record.kind)
    folder.mkdir(parents=True, exist_ok=True)
    results = folder / f"{_slug(record.preset)}.textproto"
    meta = results.with_suffix(".json")
    results.write_text(text)
    meta.write_text(json.dumps(dataclasses.asdict(record), indent=1) + "\n")
    return results, meta


def stored(kind: str, store: Path = STORE) -> Mapping[str, tuple[list[Entry], DumpRecord]]:
    """The stored results for the deviceless ``kind``, by preset (empty until a GPU run)."""
    out: dict[str, tuple[list[Entry], DumpRecord]] = {}
    for results in sorted((store / _slug(kind)).glob("*.textproto")):
        record = DumpRecord(**json.loads(results.with_suffix(".json").read_text()))
        out[record.preset] = (parse_results(results.read_text()), record)
    return out
