"""Compare compiled programs: flat metrics per program, their diff, and a schedule table.

Reads HLO text only (:mod:`labkit.xla.hlo`); no JAX import. ``identical`` ignores metadata
and the file-name tables that carry absolute paths.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping

from labkit.xla import hlo, overlap


def is_pipelined(inst: hlo.Instruction) -> bool:
    """True when XLA's collective pipeliner moved this op across a loop iteration."""
    return '"is_pipelined":true' in json.dumps(inst.backend_config(), separators=(",", ":"))


def pipelined(text: str) -> list[str]:
    """Names of the async starts that carry ``"is_pipelined":true``."""
    return [
        i.name for i in hlo.instructions(text) if i.opcode.endswith("-start") and is_pipelined(i)
    ]


def across_iterations(text: str) -> list[str]:
    """Async starts and dones in loop bodies whose partner is in another iteration.

    A loop-pipelined transfer starts in one iteration and is waited for in the next: its
    ``-done`` reads the loop parameter, not a start of the same body (or its start feeds the
    body's result). Pairs inside one iteration are not listed.
    """
    module = hlo.parse_module(text)
    paired = {n for p in hlo.async_pairs(text) for n in (p.start, p.done)}
    kinds = (*hlo.COLLECTIVE_KINDS, "send", "recv")
    return [
        i.name
        for i in hlo.instructions(text)
        if module.called_by(i.computation) == "while"
        and i.name not in paired
        and i.opcode.removesuffix("-done").removesuffix("-start") in kinds
        and i.opcode not in hlo.COLLECTIVE_KINDS  # a synchronous collective pairs with nothing
    ]


def schedule_table(text: str) -> list[dict[str, str | int | float | bool]]:
    """Every collective in program order: async or sync, bytes, what runs in between, and
    whether that work can hide the transfer (:func:`labkit.xla.overlap.estimate`)."""
    pairs = {p.start: p for p in hlo.async_pairs(text)}
    starts = {i.name: i for i in hlo.instructions(text) if i.opcode.endswith("-start")}
    estimates = {e.name: e for e in overlap.estimate(text)}
    rows: list[dict[str, str | int | float | bool]] = []
    for c in hlo.collectives(text):
        pair = pairs.get(c.name)
        rows.append(
            {
                "collective": c.name,
                "kind": c.kind,
                "bytes": c.bytes,
                "computation": c.computation,
                "in_loop": c.called_by == "while",
                "mode": "async" if pair else "sync",
                "ops_between": len(pair.ops_between) if pair else 0,
                "compute_between": pair.compute_between if pair else 0,
                "pipelined": c.name in starts and is_pipelined(starts[c.name]),
                "matmuls_between": estimates[c.name].matmuls,
                "transfer_us": round(estimates[c.name].transfer_s * 1e6, 3),
                "compute_us": round(estimates[c.name].compute_s * 1e6, 3),
                "verdict": estimates[c.name].verdict,
            }
        )
    return rows


_P2P = ("send", "recv", "send-done", "recv-done")


def metrics(text: str) -> dict[str, int]:
    """Flat numbers of one compiled program: counts and bytes per kind, async, overlap.

    The "hidden / partly hidden / exposed transfers" are :func:`labkit.xla.overlap.estimate`
    verdicts over collectives and send/recv: estimates from the program, not measurements.
    """
    colls = hlo.collectives(text)
    every = hlo.async_pairs(text)
    pairs = [p for p in every if p.is_collective]  # not async fusions, copies or send/recv
    ops = Counter(i.opcode for i in hlo.instructions(text))
    out: dict[str, int] = {}
    for c in colls:
        out[f"{c.kind} count"] = out.get(f"{c.kind} count", 0) + 1
        out[f"{c.kind} bytes"] = out.get(f"{c.kind} bytes", 0) + c.bytes
    out["async collectives"] = len(pairs)
    out["sync collectives"] = sum(not c.is_async for c in colls)
    verdicts = overlap.verdicts(overlap.estimate(text))
    for verdict in ("hidden", "partly hidden", "exposed"):
        out[f"{verdict} transfers"] = verdicts[verdict]
    out["compute ops between start/done"] = sum(p.compute_between for p in pairs)
    out["pipelined"] = len(pipelined(text))
    out["collectives in loops"] = sum(c.called_by == "while" for c in colls)
    out["send/recv ops"] = sum(ops[k] for k in _P2P)
    out["send/recv pairs"] = sum(p.kind in _P2P for p in every)
    out["transfers across loop iterations"] = len(across_iterations(text))
    out["instructions"] = sum(ops.values())
    return out


def diff(hlo_a: str, hlo_b: str) -> dict[str, tuple[int, int]]:
    """What changed between two compiled programs: ``{metric: (a, b)}`` for every metric."""
    a, b = metrics(hlo_a), metrics(hlo_b)
    return {k: (a.get(k, 0), b.get(k, 0)) for k in dict.fromkeys([*a, *b])}


def changed(d: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """Only the metrics of a :func:`diff` whose two values differ."""
    return {k: v for k, v in d.items() if v[0] != v[1]}


def identical(hlo_a: str, hlo_b: str) -> bool:
    """True when two compiled programs are the same once metadata and file tables go."""

    def norm(text: str) -> list[str]:
        lines = hlo.strip_tables(hlo.strip_metadata(text)).splitlines()
        return [line.rstrip() for line in lines if line.strip()]

    return norm(hlo_a) == norm(hlo_b)


def diff_rows(
    d: Mapping[str, tuple[int, int]], only_changed: bool = True
) -> list[dict[str, str | int]]:
    """:func:`diff` as table rows ``{"metric", "before", "after"}``."""
    items = changed(d) if only_changed else d
    return [{"metric": k, "before": a, "after": b} for k, (a, b) in items.items()]
