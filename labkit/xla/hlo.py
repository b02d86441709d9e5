"""Read XLA's compiled HLO: collectives, async start/done pairs, fusions, op counts.

Everything here parses text (``compiled.as_text()``, ``lowered.as_text(dialect="hlo")``); no
JAX import. In a scheduled module (``is_scheduled=true``) the order of a computation's
instructions is the execution order, which is what :func:`async_pairs` relies on. The text
parser itself (instructions, shapes, replica groups) is :mod:`labkit.xla.hlo_text`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TypedDict

from labkit.xla.hlo_text import (
    CALLEE_KEYS,
    COLLECTIVE_KINDS,
    NOT_COMPUTE,
    Instruction,
    Module,
    element_types,
    entry_computation,
    expand_replica_groups,
    instructions,
    integers,
    looks_like_mlir,
    parse_module,
    per_module,
    shape_bytes,
    split_top_level,
    strip_metadata,
    strip_tables,
)

__all__ = [
    "CALLEE_KEYS",
    "COLLECTIVE_KINDS",
    "NOT_COMPUTE",
    "AsyncPair",
    "Collective",
    "Instruction",
    "Module",
    "Summary",
    "async_pairs",
    "collective_counts",
    "collectives",
    "custom_calls",
    "element_types",
    "entry_computation",
    "expand_replica_groups",
    "fusions",
    "independent_kernels",
    "instructions",
    "integers",
    "is_compute",
    "kernel_counts",
    "looks_like_mlir",
    "op_histogram",
    "parse_module",
    "shape_bytes",
    "split_top_level",
    "strip_metadata",
    "strip_tables",
    "summary",
]


@dataclasses.dataclass(frozen=True)
class Collective:
    """A collective op; an async start/done pair counts once, as its start.

    ``bytes`` is the size of the full buffer involved: the operand(s) for all-reduce,
    reduce-scatter (input, before scattering), all-to-all, collective-permute/broadcast and
    ragged-all-to-all (operand 0, the input buffer); the result for all-gather (after
    gathering). ``groups_form`` is "explicit", "iota", "mesh", "none" (collective-permute)
    or "unknown"; every form expands to ``replica_groups`` except ``{}`` when the module
    header gives no device count. ``kernel`` is "triton" for XLA's Triton collective kernels
    (fusions of kind ``__triton_collective``), else "default" (NCCL on GPUs).
    ``called_by`` is the opcode that calls the computation it lives in (None for ENTRY).
    """

    name: str
    kind: str
    opcode: str
    computation: str
    called_by: str | None
    bytes: int
    dtypes: tuple[str, ...]
    replica_groups: list[list[int]] | None
    group_size: int | None
    groups_form: str
    source_target_pairs: list[tuple[int, int]] | None
    is_async: bool
    is_sync: bool
    kernel: str


@dataclasses.dataclass(frozen=True)
class AsyncPair:
    """A ``*-start``/``*-done`` (or ``send``/``recv`` and its ``-done``) pair and what the
    schedule runs between them.

    ``compute_between`` counts the kernels scheduled between start and done: anything but
    parameters, constants, bitcasts, tuples, other async starts/updates/dones, collectives
    and Triton collective kernels. A kernel in between is not a hidden transfer: a scalar
    fusion hides nothing. Whether the work in between can hide the transfer is estimated by
    :func:`labkit.xla.overlap.estimate`.
    """

    start: str
    done: str
    kind: str
    computation: str
    ops_between: list[str]
    opcodes_between: list[str]
    compute_between: int
    is_sync: bool
    is_collective: bool
    kernel: str


def _groups(inst: Instruction, num_devices: int | None) -> tuple[list[list[int]] | None, str]:
    if "permute" in inst.opcode:
        return None, "none"
    text = inst.attr("replica_groups") or "{}"  # absent means one group of all devices
    try:
        groups = expand_replica_groups(text, num_devices)
    except ValueError:
        return None, "unknown"
    return groups, "mesh" if text.startswith("mesh") else "iota" if "<=" in text else "explicit"


def _fusion_kind(inst: Instruction) -> str:
    """A fusion's backend-config kind (GPU: fusion_backend_config, CPU: fusion_config)."""
    config = inst.backend_config()
    section = config.get("fusion_backend_config") or config.get("fusion_config") or {}
    return str(section.get("kind", ""))


def _is_sync(inst: Instruction) -> bool:
    return '"is_sync": true' in json.dumps(inst.backend_config())  # at any depth


def _wrapped(module: Module, inst: Instruction) -> Instruction | None:
    """The collective run by a Triton collective fusion or an ``async-start`` wrapper."""
    called = [i for c in inst.callees("calls") for i in module.computations.get(c, ())]
    hits = [i for i in called if i.opcode.removesuffix("-start") in COLLECTIVE_KINDS]
    return hits[0] if hits else None


def _async_kind(module: Module, inst: Instruction) -> tuple[str, str]:
    """(kind, kernel) of what an async start or a fusion runs."""
    base = inst.opcode.removesuffix("-start")
    triton = base == "fusion" and _fusion_kind(inst) == "__triton_collective"
    if triton or base == "async":
        inner = _wrapped(module, inst)
        if inner is not None:
            return inner.opcode.removesuffix("-start"), "triton" if triton else "default"
    return base, "default"


_P2P_STARTS = ("send", "recv")


def _pairs(module: Module) -> list[tuple[Instruction, Instruction]]:
    """(start, done) in one computation; a done whose operand is no start (a loop-carried
    ``recv-done(get-tuple-element(param))``, started in another iteration) has no pair."""
    out = []
    for insts in module.computations.values():
        by_name = {i.name: i for i in insts}
        for done in insts:
            if done.opcode.endswith("-done") and done.operands:
                start = by_name.get(done.operands[0])
                while start is not None and start.opcode.endswith("-update") and start.operands:
                    start = by_name.get(start.operands[0])
                base = done.opcode.removesuffix("-done")
                ok = (f"{base}-start", base) if base in _P2P_STARTS else (f"{base}-start",)
                if start is not None and start.opcode in ok:
                    out.append((start, done))
    return out


def collectives(hlo: str) -> list[Collective]:
    """Every collective, in text order; async pairs once (as the start), see :class:`Collective`."""
    return list(_collectives(parse_module(hlo)))


@per_module  # lessons read a program's collectives often
def _collectives(module: Module) -> list[Collective]:
    done_of = {s.name: d for s, d in _pairs(module)}
    skip = {  # collectives run by a Triton kernel or async wrapper: reported as the wrapper
        w.name
        for insts in module.computations.values()
        for i in insts
        if _async_kind(module, i)[1] == "triton" or i.opcode == "async-start"
        if (w := _wrapped(module, i)) is not None
    }
    out = []
    for comp, insts in module.computations.items():
        shapes = module.shapes(comp)
        for inst in insts:
            kind, kernel = _async_kind(module, inst)
            if kind not in COLLECTIVE_KINDS or inst.name in skip or inst.opcode.endswith("-done"):
                continue
            inner = _wrapped(module, inst) if inst.opcode not in COLLECTIVE_KINDS else None
            inner = inner or inst
            done = done_of.get(inst.name)
            out_shape = done.shape if done is not None else inst.shape
            if done is None and inst.opcode.endswith("-start") and out_shape.startswith("(("):
                out_shape = split_top_level(out_shape[1:-1])[1]  # ((operands), result, ...)
            operands = inst.operands[:1] if kind == "ragged-all-to-all" else inst.operands
            in_shapes = [shapes.get(o, "") for o in operands]
            in_shape = "(" + ", ".join(in_shapes) + ")" if all(in_shapes) and in_shapes else ""
            groups, form = _groups(inner, module.num_devices)
            shape = out_shape if kind == "all-gather" or not in_shape else in_shape
            size = shape_bytes(shape) if shape else 0
            if kind == "reduce-scatter" and not in_shape and groups:
                size *= len(groups[0])  # input = scattered result x group size
            pairs = inner.attr("source_target_pairs")
            out.append(
                Collective(
                    inst.name,
                    kind,
                    inst.opcode,
                    inst.computation,
                    module.called_by(comp),
                    size,
                    element_types(shape),
                    groups,
                    len(groups[0]) if groups else None,
                    form,
                    [
                        (p[0], p[1])
                        for p in (integers(g) for g in re.findall(r"\{([\d,]+)\}", pairs))
                    ]
                    if pairs
                    else None,
                    done is not None or inst.opcode.endswith("-start"),
                    _is_sync(inst),
                    kernel,
                )
            )
    return out


def async_pairs(hlo: str) -> list[AsyncPair]:
    """Each ``*-start``/``*-done`` pair (through ``*-update``s) and the ops scheduled between."""
    module = parse_module(hlo)
    out = []
    for start, done in _pairs(module):
        between = module.computations[start.computation][start.index + 1 : done.index]
        compute = [i for i in between if is_compute(module, i)]
        kind, kernel = _async_kind(module, start)
        out.append(
            AsyncPair(
                start.name,
                done.name,
                kind,
                start.computation,
                [i.name for i in between],
                [i.opcode for i in between],
                len(compute),
                _is_sync(start),
                kind in COLLECTIVE_KINDS,
                kernel,
            )
        )
    return out


def is_compute(module: Module, inst: Instruction) -> bool:
    """True for an instruction that runs a compute kernel: not a parameter, constant, tuple,
    bitcast, collective, async start/update/done, or a Triton collective fusion."""
    op = inst.opcode
    if op in NOT_COMPUTE or op.endswith(("-start", "-update", "-done")):
        return False
    return not (op == "fusion" and _fusion_kind(inst) == "__triton_collective")


def independent_kernels(hlo: str, name: str) -> list[str]:
    """Compute kernels of ``name``'s computation that neither feed it nor use its result.

    These are what a scheduler *could* run while collective ``name`` is in flight: none of
    them waits for it, and it waits for none of them. A synchronous collective with none
    had nothing to overlap; one with some shows a schedule's choice.
    """
    module = parse_module(hlo)
    owner = next(
        (c for c, insts in module.computations.items() if any(i.name == name for i in insts)), None
    )
    if owner is None:
        raise ValueError(f"no instruction named {name!r} in this module")
    insts = module.computations[owner]
    by_name = {i.name: i for i in insts}
    users: dict[str, list[str]] = {i.name: [] for i in insts}
    for inst in insts:
        for operand in inst.operands:
            if operand in users:
                users[operand].append(inst.name)
    done = {p.start: p.done for p in async_pairs(hlo)}.get(name)

    def reach(starts: list[str], step: Callable[[str], Iterable[str]]) -> set[str]:
        seen: set[str] = set()
        todo = list(starts)
        while todo:
            for nxt in step(todo.pop()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    before = reach([name], lambda n: [o for o in by_name[n].operands if o in by_name])
    after = reach([name] + ([done] if done else []), lambda n: users[n])
    return [
        i.name
        for i in insts
        if i.name not in before | after | {name, done} and is_compute(module, i)
    ]


def fusions(hlo: str, nested: bool = False) -> Counter[str]:
    """Fusions by kind (``kLoop``...); kCustom ones as ``kCustom:<backend kind>``.

    Only top-level fusions (kernels) unless ``nested``: fusions inside fusion bodies are skipped.
    """
    module = parse_module(hlo)
    counts: Counter[str] = Counter()
    for inst in instructions(hlo):
        if inst.opcode not in ("fusion", "fusion-start"):
            continue
        if not nested and module.called_by(inst.computation) in ("fusion", "fusion-start"):
            continue
        key = inst.attr("kind") or "kUnknown"
        if key == "kCustom" and (detail := _fusion_kind(inst)):
            config = inst.backend_config().get("fusion_backend_config", {})
            name = config.get("custom_fusion_config", {}).get("name")
            key += f":{detail}" + (f":{name}" if name else "")
        counts[key] += 1
    return counts


def custom_calls(hlo: str) -> Counter[str]:
    """Custom calls by ``custom_call_target`` (e.g. ``__cublas$lt$matmul``)."""
    return Counter(
        (i.attr("custom_call_target") or "?").strip('"')
        for i in instructions(hlo)
        if i.opcode in ("custom-call", "custom-call-start")
    )


def collective_counts(hlo: str) -> dict[str, int]:
    """How many collectives of each kind a program has (an async pair counts once)."""
    return dict(Counter(c.kind for c in collectives(hlo)))


def kernel_counts(hlo: str) -> dict[str, int]:
    """The kernels of a compiled program: top-level fusions by kind (:func:`fusions`) plus
    custom calls by target (:func:`custom_calls`), e.g. ``kLoop``,
    ``kCustom:__triton_nested_gemm_fusion``, ``__cublas$lt$matmul``; on CPU
    ``kCustom:__ynn_fusion`` (YNNPACK)."""
    return dict(fusions(hlo) + custom_calls(hlo))


_MLIR_OP = re.compile(r'^\s*(?:%[^=]*?=\s*)?"?([a-z_][\w$]*(?:\.[\w$]+)*)"?(?=[\s(<{@%]|$)')
_MLIR_BARE = {"call": "func.call", "return": "func.return", "module": "builtin.module"}


def op_histogram(text: str, top: int | None = None) -> Counter[str]:
    """Ops by name, from HLO (opcodes of all computations) or StableHLO/MLIR text."""
    if "HloModule" in text or not looks_like_mlir(text):
        counts = Counter(i.opcode for i in instructions(text))
    else:
        counts = Counter()
        for line in text.splitlines():
            if (m := _MLIR_OP.match(line)) and line.strip()[:1] not in ("^", "}", ")", "#"):
                op = m.group(1)
                if "." in op or op in _MLIR_BARE:
                    counts[_MLIR_BARE.get(op, op)] += 1
    return Counter(dict(counts.most_common(top))) if top is not None else counts


class Summary(TypedDict):
    """:func:`summary` of a module: kinds map to counts (``collective_bytes``: to bytes)."""

    module: str
    is_scheduled: bool
    num_devices: int | None
    instructions: int
    collectives: dict[str, int]
    collective_bytes: dict[str, int]
    async_collectives: int
    async_pairs: int
    pairs_with_compute_between: int
    fusions: dict[str, int]
    custom_calls: dict[str, int]


def summary(hlo: str) -> Summary:
    """Plain-data overview: collectives and bytes per kind, async collectives, fusions, calls.

    ``async_pairs`` counts collective start/done pairs only (not async fusions or copies);
    ``pairs_with_compute_between`` those with a kernel in between, hidden or not.
    """
    module = parse_module(hlo)
    colls, pairs = collectives(hlo), [p for p in async_pairs(hlo) if p.is_collective]
    per_kind: dict[str, int] = {}
    for c in colls:
        per_kind[c.kind] = per_kind.get(c.kind, 0) + c.bytes
    return {
        "module": module.name,
        "is_scheduled": module.is_scheduled,
        "num_devices": module.num_devices,
        "instructions": len(instructions(hlo)),
        "collectives": collective_counts(hlo),
        "collective_bytes": per_kind,
        "async_collectives": sum(c.is_async for c in colls),
        "async_pairs": len(pairs),
        "pairs_with_compute_between": sum(p.compute_between > 0 for p in pairs),
        "fusions": dict(fusions(hlo)),
        "custom_calls": dict(custom_calls(hlo)),
    }
