"""labkit.xla.trace_events: timelines as trace-event JSON, and jax.profiler traces read back."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hlo_programs import ASYNC, CALLS

from labkit.xla import timeline, trace_events

HLO = Path(__file__).parent / "data" / "hlo"
SCAN = (HLO / "scan_mlp.hlo").read_text()


def _timelines() -> list[timeline.Timeline]:
    return [
        timeline.build(ASYNC, title="async"),
        timeline.build(CALLS, title="calls", unroll=4),
        timeline.build(SCAN, title="scan, folded", unroll=0),
        timeline.build(SCAN, title="scan, unrolled"),
    ]


def test_trace_follows_the_trace_event_format() -> None:
    data = trace_events.trace(*_timelines())
    jsonschema.validate(data, trace_events.SCHEMA)
    assert trace_events.problems(data) == []
    assert data["displayTimeUnit"] == "ns"
    events = data["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {"async", "calls", "scan, folded", "scan, unrolled"}
    labels = {e["args"]["labels"] for e in events if e["name"] == "process_labels"}
    assert labels == {"modelled, not measured; the kit's model (H100 SXM)"}
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads == {"compute", "collective stream"}


def test_every_span_is_an_event_with_its_numbers() -> None:
    tl = timeline.build(ASYNC, title="async")
    events = trace_events.trace(tl)["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    kinds = sorted(e["cat"] for e in complete)
    # fusion, two waits, the async transfer with its hidden and exposed parts, the sync one
    assert kinds == ["exposed", "hidden", "kernel", "sync", "transfer", "wait", "wait"]
    (move,) = [e for e in complete if e["cat"] == "transfer"]
    assert move["name"] == "ars" and move["ts"] == 0 and move["args"]["bytes"] == 256
    assert move["dur"] == pytest.approx(tl.of("transfer")[0].seconds * 1e6, abs=1e-3)
    parts = [e for e in complete if e["cat"] in ("hidden", "exposed")]
    assert sum(p["dur"] for p in parts) == pytest.approx(move["dur"], abs=2e-3)
    windows = [e for e in events if e["ph"] in ("b", "e")]
    assert [(e["ph"], e["name"], e["id"]) for e in windows] == [("b", "ars", 1), ("e", "ars", 1)]
    (kernel,) = [e for e in complete if e["cat"] == "kernel"]
    assert set(kernel["args"]) >= {"opcode", "modelled_us", "flops", "hbm_bytes", "bound_by"}


def test_times_sit_on_a_nanosecond_grid() -> None:
    """A finer grid let Perfetto push a child past its parent's end (dropped slices)."""
    for event in trace_events.trace(*_timelines())["traceEvents"]:
        for key in ("ts", "dur"):
            if key in event:
                assert event[key] * 1000 == pytest.approx(round(event[key] * 1000), abs=1e-6)


def test_folded_loops_say_how_often_their_spans_run() -> None:
    events = trace_events.trace(timeline.build(SCAN, unroll=0))["traceEvents"]
    repeated = [e for e in events if e.get("args", {}).get("runs_per_step") == 4]
    folded = [e for e in events if e.get("cat") == "folded"]
    assert repeated and folded and all(e["args"]["trips"] == 4 for e in folded)


def test_problems_finds_bad_nesting_and_open_pairs() -> None:
    bad = {
        "traceEvents": [
            {"name": "a", "ph": "X", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
            {"name": "b", "ph": "X", "ts": 5, "dur": 10, "pid": 1, "tid": 1},
            {"name": "w", "cat": "c", "ph": "b", "ts": 0, "id": 7, "pid": 1, "tid": 1},
        ]
    }
    found = trace_events.problems(bad)
    assert len(found) == 2
    assert "'b' [5.0, 15.0] overlaps 'a'" in found[0] and "unmatched" in found[1]
    assert trace_events.problems({"traceEvents": bad["traceEvents"][:1]}) == []


def test_the_schema_refuses_what_the_format_does_not_allow() -> None:
    for event in (
        {"name": "x", "ph": "X", "ts": 0, "pid": 1, "tid": 1},  # X without dur
        {"name": "x", "ph": "Q", "ts": 0, "pid": 1},  # no such phase
        {"name": "thread_title", "ph": "M", "pid": 1, "args": {}},  # no such metadata
        {"name": "x", "ph": "b", "ts": 0, "pid": 1, "cat": "c"},  # async without id
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"traceEvents": [event]}, trace_events.SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"traceEvents": [], "displayTimeUnit": "us"}, trace_events.SCHEMA)


def test_write_and_load_plain_and_gzipped(tmp_path: Path) -> None:
    tls = _timelines()
    plain = trace_events.write(tmp_path / "t.json", *tls)
    zipped = trace_events.write(tmp_path / "t.json.gz", *tls)
    assert trace_events.load(plain) == trace_events.load(zipped) == json.loads(plain.read_text())
    assert gzip.decompress(zipped.read_bytes()) == plain.read_bytes()
    assert plain.stat().st_size < 100_000  # the scanned MLP twice and two small programs
    (tmp_path / "array.json").write_text(json.dumps([{"ph": "M", "pid": 1}]))
    assert trace_events.load(tmp_path / "array.json") == {"traceEvents": [{"ph": "M", "pid": 1}]}


def _gpu_trace() -> dict[str, Any]:
    """What jax.profiler's perfetto trace of a GPU holds, in the shape the reader assumes: a
    device process with stream threads (kernels, with ``hlo_op`` and ``run_id``), a derived
    "XLA Ops" thread, and host threads; two runs of one program."""
    meta: list[dict[str, Any]] = [
        {"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "pid": 9, "name": "process_name", "args": {"name": "/host:CPU"}},
    ]
    for tid, name in ((1, "Stream #13(compute)"), (2, "Stream #21(nccl)"), (3, "XLA Ops")):
        meta.append(
            {"ph": "M", "pid": 7, "tid": tid, "name": "thread_name", "args": {"name": name}}
        )
        meta.append(
            {
                "ph": "M",
                "pid": 7,
                "tid": tid,
                "name": "thread_sort_index",
                "args": {"sort_index": tid},
            }
        )
    events = []
    for run, t0 in (("11", 1000.0), ("12", 5000.0)):
        for tid, op, start, dur in (
            (1, "gemm_fusion_dot.1", 0.0, 40.0),
            (2, "all-reduce-start.3", 10.0, 25.0),
            (1, "loop_add_fusion", 40.0, 3.0),
            (3, "gemm_fusion_dot.1", 0.0, 40.0),
        ):
            args = {"hlo_op": op, "hlo_module": "jit_step", "run_id": run, "_src": "x.cc"}
            events.append(
                {
                    "ph": "X",
                    "pid": 7,
                    "tid": tid,
                    "ts": t0 + start,
                    "dur": dur,
                    "name": op,
                    "args": args,
                }
            )
    host = {"ph": "X", "pid": 9, "tid": 1, "ts": 900.0, "dur": 5000.0, "name": "PjitFunction(step)"}
    return {"traceEvents": [*meta, *events, host], "displayTimeUnit": "ns"}


def test_measured_reads_the_last_run_of_the_gpu_streams() -> None:
    tl = trace_events.measured(_gpu_trace())
    assert tl.measured and tl.source == "/device:GPU:0"
    assert tl.title == "measured: jit_step on /device:GPU:0"
    assert tl.lanes == ("Stream #13(compute)", "Stream #21(nccl)")  # the derived line left out
    got = [
        (s.lane[:10], s.name, round(s.start_s * 1e6, 6), round(s.end_s * 1e6, 6)) for s in tl.spans
    ]
    assert got == [
        ("Stream #13", "gemm_fusion_dot.1", 0.0, 40.0),
        ("Stream #21", "all-reduce-start.3", 10.0, 35.0),
        ("Stream #13", "loop_add_fusion", 40.0, 43.0),
    ]
    assert tl.spans[0].args["run_id"] == "12" and "_src" not in tl.spans[0].args
    assert tl.totals()["kernels"] == 3 and tl.caption().startswith(tl.title + ": 43 us per step")
    first = trace_events.measured(_gpu_trace(), run=0, lanes=["XLA Ops"])
    assert first.lanes == ("XLA Ops",) and first.spans[0].args["run_id"] == "11"


def test_measured_says_what_the_trace_has_when_nothing_matches() -> None:
    with pytest.raises(ValueError, match=r"no process named like '/device:TPU'.*/device:GPU:0"):
        trace_events.measured(_gpu_trace(), process="/device:TPU")
    with pytest.raises(ValueError, match=r"no thread .* matches lanes=\['nothing'\]"):
        trace_events.measured(_gpu_trace(), lanes=["nothing"])
    no_ops = {"traceEvents": _gpu_trace()["traceEvents"][:2]}
    with pytest.raises(ValueError, match="no events naming an HLO op"):
        trace_events.measured(no_ops)


def test_measured_and_modelled_on_one_scale_and_in_one_trace() -> None:
    model = timeline.build(ASYNC, title="model")
    real = trace_events.measured(_gpu_trace())
    pic = timeline.picture(model, real)
    assert "measured: jit_step on /device:GPU:0 (measured)" in pic.svg
    assert (
        pic.caption.splitlines()[1] == "measured: jit_step on /device:GPU:0: 43 us per step, "
        "measured; 3 kernels, 68 us busy"
    )
    data = trace_events.trace(model, real)
    jsonschema.validate(data, trace_events.SCHEMA)
    labels = [e["args"]["labels"] for e in data["traceEvents"] if e["name"] == "process_labels"]
    assert labels[1] == "measured"


def test_a_real_cpu_profile_reads_back(tmp_path: Path) -> None:
    """The measured path end to end on this machine's CPU: jax.profiler's own trace file."""
    import jax
    import jax.numpy as jnp

    step = jax.jit(lambda x: jnp.tanh(x @ x).sum())
    x = jnp.ones((128, 128))
    jax.block_until_ready(step(x))
    with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
        for _ in range(2):
            jax.block_until_ready(step(x))
    tl = trace_events.measured(tmp_path, process="/host:CPU")  # the folder: its newest trace
    assert tl.measured and tl.spans and all(s.end_s >= s.start_s >= 0 for s in tl.spans)
    assert {s.args.get("hlo_module") for s in tl.spans} == {"jit__lambda"}
    assert len({s.args.get("run_id") for s in tl.spans}) == 1  # one run of the two
    jsonschema.validate(trace_events.trace(tl), trace_events.SCHEMA)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no perfetto_trace\.json\.gz under"):
        trace_events.load(tmp_path / "empty")
