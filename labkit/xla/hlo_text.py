r"""Parse XLA's HLO text into instructions, shapes and replica groups (no JAX import).

The public reading API of :mod:`labkit.xla` (see ``__all__``): :func:`parse_module` gives a
:class:`Module` of computations of :class:`Instruction`\ s in schedule order; the helpers read
shapes, element types and replica groups. The analyses built on it (collectives, async
pairs, fusions) are in :mod:`labkit.xla.hlo`; costs in :mod:`labkit.xla.cost` and
:mod:`labkit.xla.overlap`. What an instruction calls (:data:`CALLEE_KEYS`,
:meth:`Instruction.callees`, :attr:`Module.callers`) and a loop's trip count
(:attr:`Instruction.trip_count`) are read here and nowhere else.

Replica-group ids are the collective's participant ids: with ``use_global_device_ids=true``
(SPMD programs) they are logical device ids, i.e. positions in the flattened device mesh.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import re
import weakref
from collections.abc import Callable
from typing import Any, Concatenate

import numpy as np

__all__ = [
    "CALLEE_KEYS",
    "COLLECTIVE_KINDS",
    "NOT_COMPUTE",
    "Instruction",
    "Module",
    "element_types",
    "entry_computation",
    "expand_replica_groups",
    "instructions",
    "integers",
    "looks_like_mlir",
    "parse_module",
    "per_module",
    "shape_bytes",
    "split_top_level",
    "strip_metadata",
    "strip_tables",
]

COLLECTIVE_KINDS = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
    "ragged-all-to-all",
)
_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
_SUB_BYTE = {"s1", "u1", "s2", "u2", "s4", "u4", "f4e2m1fn", "f6e2m3fn", "f6e3m2fn"}
_NO_DATA = {"token", "opaque"}
# Ops that launch no kernel or only move data between devices: not "compute" for overlap.
NOT_COMPUTE = frozenset(
    {
        "parameter",
        "constant",
        "bitcast",
        "get-tuple-element",
        "tuple",
        "after-all",
        "add-dependency",
        "opt-barrier",
        "partition-id",
        "replica-id",
        "domain",
        "send",
        "recv",
        *COLLECTIVE_KINDS,
    }
)
# The attributes whose value names computations an instruction calls: ``calls=%f`` (fusions,
# async and call wrappers), ``to_apply=%add`` (reducers, ``call``), a ``while``'s ``body`` and
# ``condition``, a ``conditional``'s branches (``branch_computations={%a, %b}`` or the
# true/false form), a custom call's ``called_computations``.
CALLEE_KEYS = (
    "calls",
    "to_apply",
    "body",
    "condition",
    "branch_computations",
    "true_computation",
    "false_computation",
    "called_computations",
)
_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
# A computation: "[ENTRY] %name (params) -> shape {" ... a "}" line at column 0.
_BLOCK = re.compile(
    r"^(ENTRY\s+)?%?([\w.\-]+)[ \t]*(?:\([^\n]*)?\{[ \t]*\n(.*?)^\}[ \t]*$", re.M | re.S
)
_CALLEE = re.compile(r"%?([\w.\-]+)")
_INSTR = re.compile(r"^(ROOT\s+)?%?([\w.\-]+)\s*=\s+")
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\](\{[^{}]*\})?")
_MLIR = re.compile(r'^\s*(module\b|func\.func\b|(%\S+\s*=\s*)?"?(stablehlo|mhlo)\.)', re.M)


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One HLO instruction; ``index`` is its position (schedule slot) in its computation."""

    computation: str
    name: str
    opcode: str
    shape: str
    operands: tuple[str, ...]
    attrs: str
    is_root: bool
    is_entry: bool
    index: int
    parameter_number: int | None = None  # N of a ``parameter(N)``

    @functools.cached_property
    def attributes(self) -> dict[str, str]:
        """The ``key=value`` attributes as raw text values."""
        out: dict[str, str] = {}
        for part in split_top_level(self.attrs):
            key, sep, value = part.partition("=")
            # mesh[...], device_ids=(...) {...} holds a top-level comma: glue it back
            if sep and key == "device_ids" and "replica_groups" in out:
                out["replica_groups"] += ", " + part
            elif sep:
                out[key.strip()] = value.strip()
        return out

    def attr(self, key: str) -> str | None:
        """The raw text of attribute ``key``, or None."""
        return self.attributes.get(key)

    def backend_config(self) -> dict[str, Any]:
        """``backend_config`` parsed from JSON ({} when absent or not JSON)."""
        raw = self.attr("backend_config")
        try:
            value = json.loads(raw) if raw else {}
            value = json.loads(value) if isinstance(value, str) and value else value
        except json.JSONDecodeError:
            return {}
        return value if isinstance(value, dict) else {}

    def callees(self, *keys: str) -> tuple[str, ...]:
        """Names of the computations this instruction calls through ``keys`` (default: every
        key of :data:`CALLEE_KEYS`), in that order; ``()`` when it calls none."""
        unknown = [k for k in keys if k not in CALLEE_KEYS]
        if unknown:
            raise ValueError(
                f"{sorted(unknown)} names no called computations: pick from {CALLEE_KEYS}"
            )
        found = self._callees
        return tuple(name for key in keys or CALLEE_KEYS for name in found.get(key, ()))

    @functools.cached_property
    def _callees(self) -> dict[str, tuple[str, ...]]:
        out = {}
        for key in CALLEE_KEYS:
            value = self.attributes.get(key) or ""
            if value and "=" not in value:  # a name, or {names}; nothing else is a callee list
                out[key] = tuple(_CALLEE.findall(value))
        return out

    @functools.cached_property
    def trip_count(self) -> int | None:
        """How many times a ``while`` loop runs its body, as XLA knows it (``known_trip_count``
        in its backend_config); None when XLA knows none or this is no loop."""
        n = self.backend_config().get("known_trip_count", {}).get("n")
        return int(n) if str(n).isdigit() else None


@dataclasses.dataclass(frozen=True, eq=False)  # one parse is one module: hashed by identity
class Module:
    """A parsed HLO module: its computations, each a tuple of instructions in text order.

    In a scheduled module (``is_scheduled``, what ``compiled.as_text()`` gives) text order is
    execution order. ``num_devices`` is ``num_partitions x replica_count`` from the header
    (None when absent); ``callers`` maps a computation to the first instruction, in text order,
    that calls it (a ``fusion``, a ``while``...; :meth:`Instruction.callees`). The entry
    computation, and any computation nothing calls, has no caller.
    """

    name: str
    is_scheduled: bool
    num_devices: int | None
    entry: str
    computations: dict[str, tuple[Instruction, ...]]
    callers: dict[str, Instruction]  # computation -> the first instruction that calls it

    @functools.cached_property
    def _shapes(self) -> dict[str, dict[str, str]]:
        return {c: {i.name: i.shape for i in insts} for c, insts in self.computations.items()}

    def shapes(self, computation: str) -> dict[str, str]:
        """Instruction name -> HLO shape in ``computation`` (empty when there is none); built
        once per module, since operand shapes are read per instruction."""
        return self._shapes.get(computation, {})

    def called_by(self, computation: str) -> str | None:
        """The opcode of the instruction that calls ``computation`` (None: nothing calls it)."""
        caller = self.callers.get(computation)
        return caller.opcode if caller is not None else None


def per_module[**P, T](
    fn: Callable[Concatenate[Module, P], T],
) -> Callable[Concatenate[Module, P], T]:
    """Cache ``fn(module, *args)`` for as long as ``module`` lives (a fact read many times
    from one parse: its trip multipliers, FLOPs per computation, collectives). Callers must
    not change what it returns."""
    memo: weakref.WeakKeyDictionary[Module, dict[tuple[object, ...], T]] = (
        weakref.WeakKeyDictionary()
    )

    @functools.wraps(fn)
    def cached(module: Module, /, *args: P.args, **kwargs: P.kwargs) -> T:
        if kwargs:
            return fn(module, *args, **kwargs)
        found = memo.setdefault(module, {})
        if args not in found:
            found[args] = fn(module, *args, **kwargs)  # kwargs: none here
        return found[args]

    return cached


_TOKENS = re.compile(r'"(?:\\.|[^"\\])*"|[()\[\]{},]')  # strings, brackets, commas


def _depth(text: str) -> int:
    """Open brackets left at the end of ``text`` (strings skipped)."""
    return sum((t in "([{") - (t in ")]}") for t in _TOKENS.findall(text))


def looks_like_mlir(text: str) -> bool:
    """True when ``text`` reads as StableHLO/MLIR (``module``, ``func.func``, ``stablehlo.``)."""
    return bool(_MLIR.search(text))


def split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets and strings (operand lists, tuple shapes)."""
    parts, depth, last = [], 0, 0
    for m in _TOKENS.finditer(text):
        depth += (m.group() in "([{") - (m.group() in ")]}")
        if m.group() == "," and depth == 0:
            parts.append(text[last : m.start()])
            last = m.end()
    return [p.strip() for p in [*parts, text[last:]] if p.strip()]


def _close(text: str, i: int) -> int:
    """Index just past the bracket that closes the one at ``text[i]``."""
    depth = 0
    for m in _TOKENS.finditer(text, i):
        depth += (m.group() in "([{") - (m.group() in ")]}")
        if depth == 0:
            return m.end()
    raise ValueError(f"unbalanced brackets in HLO text {text[i : i + 120]!r}")


def strip_tables(hlo: str) -> str:
    """Remove the FileNames/FunctionNames/FileLocations/StackFrames tables (absolute paths)."""
    out, skipping = [], False
    for line in hlo.splitlines():
        if line.strip() in _TABLES:
            skipping = True
        elif skipping and re.match(r"\d+ ", line):
            continue
        else:
            skipping = False
            out.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)) + ("\n" if hlo.endswith("\n") else "")


def strip_metadata(hlo: str, backend_config: bool = False) -> str:
    """Remove ``metadata={...}`` (and ``backend_config=...`` if asked) for readable HLO."""
    keys = "metadata|backend_config" if backend_config else "metadata"
    pattern, out, pos = re.compile(rf",\s*(?:{keys})=(?=[{{\"])"), [], 0
    for m in pattern.finditer(hlo):
        if m.start() < pos:
            continue
        out.append(hlo[pos : m.start()])
        j = m.end()
        pos = _close(hlo, j) if hlo[j] == "{" else _TOKENS.match(hlo, j).end()  # type: ignore[union-attr]
    return "".join(out) + hlo[pos:]


def _parse_instruction(text: str, comp: str, is_entry: bool, index: int) -> Instruction:
    text = re.sub(r"/\*.*?\*/", "", text)  # /*index=5*/ in long tuples and operand lists
    m = _INSTR.match(text)
    assert m is not None
    rest, shape = text[m.end() :], ""
    if rest.startswith("("):
        end = _close(rest, 0)
        shape, rest = rest[:end], rest[end:].lstrip()
    elif (sm := _ARRAY.match(rest)) and rest[sm.end() : sm.end() + 1] == " ":
        shape, rest = sm.group(0), rest[sm.end() :].lstrip()
    om = re.match(r"([a-z][\w\-]*)\(", rest)
    if om is None:
        raise ValueError(f"cannot read HLO instruction {text[:120]!r}: no opcode(...) found")
    end = _close(rest, om.end() - 1)
    operand_text = rest[om.end() : end - 1]
    operands: list[str] = []
    if om.group(1) not in ("parameter", "constant"):
        for part in split_top_level(operand_text):
            name = part.split()[-1].lstrip("%")
            if re.fullmatch(r"[\w.\-]+", name):
                operands.append(name)
    attrs = rest[end:].strip().lstrip(",").strip()
    number = int(operand_text) if om.group(1) == "parameter" and operand_text.isdigit() else None
    return Instruction(
        comp,
        m.group(2),
        om.group(1),
        shape,
        tuple(operands),
        attrs,
        bool(m.group(1)),
        is_entry,
        index,
        number,
    )


@functools.lru_cache(maxsize=16)
def parse_module(hlo: str) -> Module:
    """Parse HLO text (``compiled.as_text()``, ``lowered.as_text(dialect="hlo")``); cached.

    Raises ValueError for StableHLO/MLIR text or text that is not HLO.
    """
    if looks_like_mlir(hlo) and "HloModule" not in hlo:
        raise ValueError(
            "this is StableHLO/MLIR text, not HLO: pass compiled.as_text() or "
            "lowered.as_text(dialect='hlo'); op_histogram() reads both"
        )
    text = strip_tables(hlo)
    blocks = list(_BLOCK.finditer(text))
    rest = re.sub(r"^(HloModule .*|//.*)$", "", _BLOCK.sub("", text), flags=re.M).strip()
    if rest or not blocks:
        raise ValueError(
            f"not HLO text: {(rest or text)[:80]!r} is not part of a computation "
            "('name {' ... '}'); pass compiled.as_text() or lowered.as_text(dialect='hlo')"
        )
    entry = next((b.group(2) for b in blocks if b.group(1)), blocks[-1].group(2))
    comps: dict[str, tuple[Instruction, ...]] = {}
    for block in blocks:
        texts: list[str] = []
        for line in filter(None, (raw.strip() for raw in block.group(3).splitlines())):
            starts = _INSTR.match(line) and not _depth(texts[-1]) if texts else True
            if starts and not (texts and texts[-1].endswith(",")):
                texts.append(line)
            else:  # an instruction printed over several lines
                texts[-1] += " " + line
        name = block.group(2)
        comps[name] = tuple(
            _parse_instruction(t, name, name == entry, i) for i, t in enumerate(texts)
        )
    callers: dict[str, Instruction] = {}
    for inst in (i for insts in comps.values() for i in insts):
        for callee in inst.callees():
            callers.setdefault(callee, inst)
    header = re.search(r"^HloModule\s+([\w.\-]+)(.*)$", text, re.M)
    hdr = header.group(2) if header else ""
    sizes = [int(v) for v in re.findall(r"\b(?:num_partitions|replica_count)=(\d+)", hdr)]
    return Module(
        header.group(1) if header else "",
        "is_scheduled=true" in hdr,
        math.prod(sizes) if sizes else None,
        entry,
        comps,
        callers,
    )


def instructions(hlo: str) -> list[Instruction]:
    """Every instruction of every computation, in text (= schedule) order."""
    return [i for insts in parse_module(hlo).computations.values() for i in insts]


def entry_computation(hlo: str) -> list[Instruction]:
    """The ENTRY computation's instructions, in schedule order."""
    module = parse_module(hlo)
    return list(module.computations[module.entry])


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape (tuples summed; sub-byte types packed only with a ``E(n)`` layout)."""
    shape = shape.strip()
    if shape.startswith("("):
        return sum(shape_bytes(p) for p in split_top_level(shape[1:-1]))
    m = _ARRAY.fullmatch(shape)
    if m is None:
        raise ValueError(f"not an HLO shape: {shape!r} (expected e.g. 'f32[8,128]{{1,0}}')")
    dtype, dims, layout = m.group(1), m.group(2), m.group(3) or ""
    if dtype in _NO_DATA:
        return 0
    if "?" in dims:
        raise ValueError(f"shape {shape!r} has an unbounded dynamic dimension: size unknown")
    count = math.prod(int(d.replace("<=", "")) for d in dims.split(",") if d.strip())
    if packed := re.search(r"E\((\d+)\)", layout):
        return math.ceil(count * int(packed.group(1)) / 8)
    if dtype in _BYTES:
        return count * _BYTES[dtype]
    if dtype.startswith("f8") or dtype in _SUB_BYTE:
        return count  # one byte per element in memory unless the layout packs them
    raise ValueError(f"unknown HLO element type {dtype!r} in shape {shape!r}")


def element_types(shape: str) -> tuple[str, ...]:
    """The element types of an HLO shape (tuples: every member), sorted, without token/opaque."""
    return tuple(sorted({d for d in re.findall(r"([a-z][a-z0-9]*)\[", shape)} - _NO_DATA))


def integers(text: str) -> list[int]:
    """Every non-negative integer written in ``text`` (``"{1,0}"`` -> ``[1, 0]``)."""
    return [int(v) for v in re.findall(r"\d+", text)]


def _iota(text: str) -> np.ndarray:
    """Device ids of ``[dims]T(perm)``: iota reshaped to dims, transposed, flattened."""
    m = re.fullmatch(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
    if m is None:
        raise ValueError(f"unrecognised iota device list {text!r}")
    dims = integers(m.group(1))
    perm = integers(m.group(2)) if m.group(2) else list(range(len(dims)))
    return np.arange(math.prod(dims)).reshape(dims).transpose(perm).ravel()


def expand_replica_groups(text: str, num_devices: int | None = None) -> list[list[int]] | None:
    """Expand a ``replica_groups=`` value: explicit ``{{0,1},{2,3}}``, iota ``[2,4]<=[4,2]T(1,0)``
    or mesh ``mesh['x'=4,'y'=2] {'x'}`` (sub-axes ``'x':(pre)size``, optional ``device_ids``).

    A mesh axis list selects the mesh dimensions that vary inside a group, in the listed order
    (first listed = slowest); sub-axis ``x:(pre)size`` is the factor ``size`` of axis ``x`` that
    follows a major factor ``pre``. ``{}`` means all devices: None unless ``num_devices``.
    """
    text = text.strip()
    if m := re.fullmatch(r"\[(\d+),(\d+)\]<=(\[[\d,]+\](?:T\([\d,]+\))?)", text):
        return _iota(m.group(3)).reshape(int(m.group(1)), int(m.group(2))).tolist()
    if text.startswith("mesh["):
        return _expand_mesh(text)
    if re.fullmatch(r"\{(\s*\{[\d,\s]*\}\s*,?)*\}", text):
        groups = [integers(g) for g in re.findall(r"\{([\d,\s]*)\}", text[1:-1])]
        if groups:
            return groups
        return [list(range(num_devices))] if num_devices else None
    raise ValueError(f"unrecognised replica_groups {text!r}")


def _expand_mesh(text: str) -> list[list[int]]:
    m = re.fullmatch(r"mesh\[([^\]]*)\](?:\s*,\s*device_ids=\((.*)\))?\s*\{([^}]*)\}", text)
    if m is None:
        raise ValueError(f"unrecognised mesh replica_groups {text!r}")
    axes = [re.fullmatch(r"'?([^'=]+)'?=(\d+)", a.strip()) for a in m.group(1).split(",")]
    found = [a for a in axes if a is not None]
    if len(found) != len(axes):
        raise ValueError(f"unrecognised mesh axes in {text!r}")
    names, sizes = [a.group(1) for a in found], [int(a.group(2)) for a in found]
    ids = np.arange(math.prod(sizes))
    if spec := (m.group(2) or "").strip():  # "[4,2]T(1,0)" (iota) or "3,1,0,2" (a list)
        ids = _iota(spec.split("<=")[-1]) if "[" in spec else np.array(integers(spec))
    refs = []  # (axis index, pre, size)
    for ref in split_top_level(m.group(3)):
        rm = re.fullmatch(r"'?([^':]+)'?(?::\((\d+)\)(\d+))?", ref)
        if rm is None or rm.group(1) not in names:
            raise ValueError(f"unrecognised mesh axis reference {ref!r} in {text!r}")
        axis = names.index(rm.group(1))
        pre, size = (int(rm.group(2)), int(rm.group(3))) if rm.group(2) else (1, sizes[axis])
        refs.append((axis, pre, size))
    cuts = [{1, n} for n in sizes]  # split points of each axis, counted from the major end
    for axis, pre, size in refs:
        cuts[axis] |= {pre, pre * size}
    factors: list[tuple[int, int]] = []  # (axis, pre) of each dimension after splitting
    shape: list[int] = []
    for axis, cut in enumerate(cuts):
        for lo, hi in itertools.pairwise(sorted(cut)):
            if hi % lo:
                raise ValueError(f"mesh sub-axes of {names[axis]!r} do not nest in {text!r}")
            factors.append((axis, lo))
            shape.append(hi // lo)
    in_group = [
        d
        for axis, pre, size in refs
        for d, (a, p) in enumerate(factors)
        if a == axis and pre <= p < pre * size
    ]
    others = [d for d in range(len(shape)) if d not in in_group]
    group_size = math.prod(shape[d] for d in in_group)
    return ids.reshape(shape).transpose(others + in_group).reshape(-1, group_size).tolist()
