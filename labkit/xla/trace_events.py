"""Timelines as Chrome / Perfetto trace-event JSON, and a measured ``jax.profiler`` trace read back.

The file is the JSON Object Format of the Trace Event Format (the format Chrome's trace viewer,
Perfetto and ``jax.profiler``'s ``perfetto_trace.json.gz`` use):
``{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}``. Each
:class:`~labkit.xla.timeline.Timeline` is one process (``pid`` 1, 2...) named by its title,
labelled with its source ("modelled, not measured" unless measured); each lane is a thread. A
span is a complete event (``"ph": "X"``, ``ts`` and ``dur`` in microseconds) carrying its
numbers in ``args`` (bytes, FLOPs, modelled us...); complete events on one thread nest or
follow each other: a loop holds its kernels, a transfer holds its hidden and exposed parts.
An async collective's window, from start to done, is an async pair (``"b"`` / ``"e"``, one id
each), since windows may overlap. :data:`SCHEMA` is the part of the format these files use, as
a JSON Schema; :func:`problems` checks what a schema cannot (nesting, pairs).

:func:`measured` reads a ``jax.profiler`` trace (``jax.profiler.trace(folder,
create_perfetto_trace=True)`` writes ``perfetto_trace.json.gz`` under ``folder``) into a measured
:class:`~labkit.xla.timeline.Timeline`, to draw beside a modelled one on the same scale
(:func:`labkit.xla.timeline.picture`).
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from labkit.core.types import JSON
from labkit.xla.timeline import MODELLED, Span, Timeline

__all__ = ["SCHEMA", "load", "measured", "problems", "trace", "write"]

_ID: dict[str, JSON] = {"type": "integer", "minimum": 0}
# The Trace Event Format (JSON Object Format) as far as these files and jax.profiler's use it:
# complete (X), duration (B/E), instant (i/I), counter (C), async (b/e/n) and metadata (M)
# events. Times are microseconds; displayTimeUnit only changes how a viewer prints them.
SCHEMA: dict[str, JSON] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Trace Event Format, JSON Object Format",
    "type": "object",
    "required": ["traceEvents"],
    "properties": {
        "traceEvents": {"type": "array", "items": {"$ref": "#/$defs/event"}},
        "displayTimeUnit": {"enum": ["ms", "ns"]},
        "otherData": {"type": "object"},
    },
    "$defs": {
        "event": {
            "type": "object",
            "required": ["ph", "pid"],
            "properties": {
                "name": {"type": "string"},
                "cat": {"type": "string"},
                "ph": {"enum": ["X", "B", "E", "i", "I", "C", "b", "e", "n", "M"]},
                "ts": {"type": "number", "minimum": 0},
                "dur": {"type": "number", "minimum": 0},
                "pid": _ID,
                "tid": _ID,
                "id": {"type": ["integer", "string"]},
                "s": {"enum": ["g", "p", "t"]},
                "args": {"type": "object"},
            },
            "allOf": [
                {
                    "if": {"properties": {"ph": {"const": "X"}}},
                    "then": {"required": ["name", "ts", "dur", "tid"]},
                },
                {
                    "if": {"properties": {"ph": {"enum": ["b", "e", "n"]}}},
                    "then": {"required": ["name", "cat", "id", "ts"]},
                },
                {
                    "if": {"properties": {"ph": {"enum": ["B", "E", "i", "I", "C"]}}},
                    "then": {"required": ["ts"]},
                },
                {
                    "if": {"properties": {"ph": {"const": "M"}}},
                    "then": {
                        "required": ["name", "args"],
                        "properties": {
                            "name": {
                                "enum": [
                                    "process_name",
                                    "process_labels",
                                    "process_sort_index",
                                    "thread_name",
                                    "thread_sort_index",
                                ]
                            }
                        },
                    },
                },
            ],
        }
    },
}


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _us(seconds: float) -> float:
    """Microseconds on a whole-nanosecond grid: ends computed from it nest exactly as the
    spans do (a finer grid lets a reader's rounding push a child past its parent's end)."""
    return _ns(seconds) / 1000


def _args(span: Span) -> dict[str, JSON]:
    out: dict[str, JSON] = {
        k: (round(v, 4) if isinstance(v, float) else v) for k, v in span.args.items()
    }
    if span.repeat > 1:
        out["runs_per_step"] = span.repeat
    return out


def _complete(
    name: str, cat: str, start_s: float, end_s: float, pid: int, tid: int, args: dict[str, JSON]
) -> dict[str, JSON]:
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": _us(start_s),
        "dur": (_ns(end_s) - _ns(start_s)) / 1000,
        "pid": pid,
        "tid": tid,
        "args": args,
    }


def trace(*timelines: Timeline) -> dict[str, JSON]:
    """The timelines as one trace-event JSON object (one process each; see the module doc)."""
    events: list[JSON] = []
    window_id = 0
    for p, tl in enumerate(timelines, start=1):
        label = "measured" if tl.measured else f"{MODELLED}; {tl.source}"
        events += [
            {"name": "process_name", "ph": "M", "pid": p, "args": {"name": tl.title}},
            {"name": "process_labels", "ph": "M", "pid": p, "args": {"labels": label}},
            {"name": "process_sort_index", "ph": "M", "pid": p, "args": {"sort_index": p}},
        ]
        tids = {lane: k for k, lane in enumerate(tl.lanes, start=1)}
        for lane, tid in tids.items():
            events += [
                {"name": "thread_name", "ph": "M", "pid": p, "tid": tid, "args": {"name": lane}},
                {
                    "name": "thread_sort_index",
                    "ph": "M",
                    "pid": p,
                    "tid": tid,
                    "args": {"sort_index": tid},
                },
            ]
        for span in tl.spans:
            tid = tids[span.lane]
            args = _args(span)
            if span.kind == "window":
                window_id += 1
                common: dict[str, JSON] = {
                    "cat": "collective window",
                    "id": window_id,
                    "pid": p,
                    "tid": tid,
                }
                events.append(
                    {"name": span.name, "ph": "b", "ts": _us(span.start_s), **common, "args": args}
                )
                events.append({"name": span.name, "ph": "e", "ts": _us(span.end_s), **common})
                continue
            events.append(_complete(span.name, span.kind, span.start_s, span.end_s, p, tid, args))
            if span.kind == "transfer":
                cut = span.start_s + float(span.args.get("hidden_us", 0)) * 1e-6
                for part, lo, hi in (("hidden", span.start_s, cut), ("exposed", cut, span.end_s)):
                    if _ns(hi) > _ns(lo):
                        events.append(_complete(f"{part} part", part, lo, hi, p, tid, {}))
    other: dict[str, JSON] = {
        "generator": "labkit.xla.timeline",
        "timelines": [
            {"title": t.title, "source": t.source, "measured": t.measured, "caption": t.caption()}
            for t in timelines
        ],
    }
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}


def write(path: str | Path, *timelines: Timeline) -> Path:
    """Write the timelines' trace (:func:`trace`) to ``path`` (gzipped when it ends in ``.gz``)."""
    out = Path(path)
    text = json.dumps(trace(*timelines), separators=(",", ":"))
    if out.suffix == ".gz":
        out.write_bytes(gzip.compress(text.encode()))
    else:
        out.write_text(text)
    return out


def load(path: str | Path) -> dict[str, Any]:
    """A trace-event file (``.json`` or ``.json.gz``) as its JSON object; a bare event list
    (the format's JSON Array Format) comes back as ``{"traceEvents": [...]}``. A folder: the
    newest ``perfetto_trace.json.gz`` under it (where ``jax.profiler.trace`` writes one)."""
    path = Path(path)
    if path.is_dir():
        found = sorted(path.rglob("perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
        if not found:
            raise FileNotFoundError(
                f"no perfetto_trace.json.gz under {path}: profile with "
                "jax.profiler.trace(folder, create_perfetto_trace=True)"
            )
        path = found[-1]
    raw = path.read_bytes()
    data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return {"traceEvents": data} if isinstance(data, list) else data


def problems(data: Mapping[str, Any]) -> list[str]:
    """What the schema cannot check: complete events on one thread must nest or follow each
    other (else viewers draw them wrongly), and every async ``b`` needs one ``e``."""
    found: list[str] = []
    by_thread: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    opened: dict[tuple[str, object], int] = defaultdict(int)
    for event in data.get("traceEvents", []):
        ph = event.get("ph")
        if ph == "X":
            start = float(event["ts"])
            by_thread[(event["pid"], event.get("tid", 0))].append(
                (start, start + float(event["dur"]), str(event.get("name")))
            )
        elif ph in ("b", "e"):
            opened[(str(event.get("cat")), event.get("id"))] += 1 if ph == "b" else -1
    for (pid, tid), spans in by_thread.items():
        stack: list[tuple[float, float, str]] = []
        for start, end, name in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][1] <= start + 1e-9:
                stack.pop()
            if stack and end > stack[-1][1] + 1e-9:
                found.append(
                    f"pid {pid} tid {tid}: {name!r} [{start}, {end}] overlaps {stack[-1][2]!r} "
                    f"[{stack[-1][0]}, {stack[-1][1]}] without nesting in it"
                )
            stack.append((start, end, name))
    found += [f"async pair {key} has {n:+d} unmatched begins" for key, n in opened.items() if n]
    return found


def _lanes(
    names: Mapping[int, str], used: set[int], order: Mapping[int, int], pick: Sequence[str] | None
) -> list[int]:
    tids = sorted(used, key=lambda t: (order.get(t, t), t))
    if pick is None:
        streams = [t for t in tids if names.get(t, "").startswith("Stream")]
        return streams or tids
    return [t for t in tids if any(p in names.get(t, "") for p in pick)]


def measured(
    data: Mapping[str, Any] | str | Path,
    process: str = "/device:GPU:0",
    lanes: Sequence[str] | None = None,
    run: int = -1,
    title: str = "",
) -> Timeline:
    """One run of an XLA program from a ``jax.profiler`` trace, as a measured timeline.

    ``data``: the trace's JSON object, its file, or the folder the profiler wrote to.
    ``process``: a substring of the process name to read ("/device:GPU:0"; on a CPU,
    "/host:CPU"). Its events that name an HLO op (``args.hlo_op``: kernels and XLA ops) are
    kept; ``lanes`` picks threads by substrings of their names (default: the GPU's
    ``Stream ...`` threads where there are any, else every thread with such events). Events
    are grouped by ``args.run_id`` (one program run each) and run ``run`` is kept (default the
    last: warmed up); times start at 0 with the run's first event.
    """
    trace_data = data if isinstance(data, Mapping) else load(data)
    events = trace_data.get("traceEvents", [])
    processes = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e.get("name") == "process_name" and e.get("ph") == "M"
    }
    pids = [pid for pid, name in processes.items() if process in name]
    if not pids:
        raise ValueError(
            f"no process named like {process!r} in this trace; it has "
            f"{sorted(processes.values())}: pass process= one of those"
        )
    pid = pids[0]
    threads = {
        e["tid"]: e["args"]["name"]
        for e in events
        if e.get("pid") == pid and e.get("name") == "thread_name"
    }
    order = {
        e["tid"]: e["args"].get("sort_index", 0)
        for e in events
        if e.get("pid") == pid and e.get("name") == "thread_sort_index"
    }
    ops = [
        e
        for e in events
        if e.get("pid") == pid and e.get("ph") == "X" and "hlo_op" in e.get("args", {})
    ]
    if not ops:
        raise ValueError(
            f"{processes[pid]!r} has no events naming an HLO op (args.hlo_op): did an XLA "
            "program run while the profiler was on?"
        )
    chosen = _lanes(threads, {e.get("tid", 0) for e in ops}, order, lanes)
    ops = [e for e in ops if e.get("tid", 0) in chosen]
    if not ops:
        raise ValueError(
            f"no thread of {processes[pid]!r} matches lanes={list(lanes or [])}: its threads "
            f"are {sorted(threads.values())}"
        )
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in ops:
        runs[str(e["args"].get("run_id", ""))].append(e)
    in_order = sorted(runs.values(), key=lambda r: min(float(e["ts"]) for e in r))
    picked = in_order[run]
    t0 = min(float(e["ts"]) for e in picked)
    names = {t: threads.get(t, f"thread {t}") for t in chosen}
    spans = []
    for e in sorted(picked, key=lambda e: float(e["ts"])):
        start = (float(e["ts"]) - t0) * 1e-6
        args = {
            k: v
            for k, v in e.get("args", {}).items()
            if isinstance(v, (str, int, float)) and not k.startswith("_")
        }
        spans.append(
            Span(
                names[e.get("tid", 0)],
                str(e["args"]["hlo_op"]),
                "measured",
                start,
                start + float(e.get("dur", 0)) * 1e-6,
                args,
            )
        )
    module = str(picked[0]["args"].get("hlo_module", ""))
    lane_names = tuple(names[t] for t in chosen if any(s.lane == names[t] for s in spans))
    name = title or f"measured: {module or 'program'} on {processes[pid]}"
    return Timeline(name, processes[pid], True, lane_names, tuple(spans))
