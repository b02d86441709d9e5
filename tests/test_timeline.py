"""labkit.xla.timeline: a compiled program's kernels and collectives placed in time by a model."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hlo_programs import ASYNC, CALLS, HEADER, SYNC

from labkit.core.hardware import LATENCIES, hardware
from labkit.xla import overlap, predict, timeline
from labkit.xla.hlo_text import Instruction

HLO = Path(__file__).parent / "data" / "hlo"
FIXTURES = sorted(p for p in HLO.glob("*.hlo") if "lowered" not in p.name)
H100 = hardware("H100 SXM")
LINK = H100.nvlink_gbps / 2 * 1e9  # bytes/s, one direction (the model's link)
FLOOR = LATENCIES.kernel_floor_us * 1e-6
ALPHA = LATENCIES.collective_us * 1e-6


def ring(nbytes: int, n: int = 8) -> float:
    """An all-reduce's transfer by the model: alpha + 2(n-1)/n x bytes / link."""
    return ALPHA + 2 * (n - 1) / n * nbytes / LINK


# Two async all-reduces started back to back, one kernel, then both dones: one stream, so the
# second transfer queues behind the first.
QUEUED = (
    HEADER
    + """
%fused (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %n = f32[8]{0} negate(%p)
}

ENTRY %main (a: f32[64], c: f32[64], b: f32[8]) -> (f32[64], f32[64], f32[8]) {
  %a = f32[64]{0} parameter(0)
  %c = f32[64]{0} parameter(1)
  %b = f32[8]{0} parameter(2)
  %s1 = ((f32[64]{0}), f32[64]{0}) all-reduce-start(%a), replica_groups={}, to_apply=%add
  %s2 = ((f32[64]{0}), f32[64]{0}) all-reduce-start(%c), replica_groups={}, to_apply=%add
  %f = f32[8]{0} fusion(%b), kind=kLoop, calls=%fused
  %d1 = f32[64]{0} all-reduce-done(%s1)
  %d2 = f32[64]{0} all-reduce-done(%s2)
  ROOT %t = (f32[64]{0}, f32[64]{0}, f32[8]{0}) tuple(%d1, %d2, %f)
}
"""
)


def test_async_then_sync_by_hand() -> None:
    """ASYNC: an async all-reduce of 256 B with one 1 us kernel beside it, then a synchronous
    one of 32 B: the kernel hides 1 us of the first, the rest of both is exposed."""
    tl = timeline.build(ASYNC, title="by hand")
    first, second = ring(256), ring(32)
    (move,) = tl.of("transfer")
    assert (move.name, move.start_s, move.end_s) == ("ars", 0.0, pytest.approx(first))
    assert move.args["hidden_us"] == pytest.approx(FLOOR * 1e6)
    assert move.args["exposed_us"] == pytest.approx((first - FLOOR) * 1e6)
    (sync,) = tl.of("sync")
    assert (sync.name, sync.start_s) == ("ar", pytest.approx(first))
    assert tl.end_s == pytest.approx(first + second)
    waits = tl.of("wait")
    assert [w.args["waits_for"] for w in waits] == ["ars", "ar"]
    (window,) = tl.of("window")  # from start to done, on the collective's lane
    assert (window.lane, window.start_s, window.end_s) == ("collective stream", 0.0, move.end_s)
    t = tl.totals()
    assert (t["collectives"], t["async_collectives"], t["sync_collectives"]) == (2, 1, 1)
    assert (t["hidden"], t["partly_hidden"], t["exposed"]) == (0, 1, 1)
    assert tl.lanes == ("compute", "collective stream")


def test_sync_program_blocks_compute_for_every_transfer() -> None:
    tl = timeline.build(SYNC)
    assert [s.kind for s in tl.of("transfer", "sync")] == ["sync", "sync"]
    assert tl.totals()["hidden_us"] == 0
    assert tl.end_s == pytest.approx(ring(256) + FLOOR + ring(32))


def test_one_stream_queues_the_second_transfer() -> None:
    """The overlap model gives each transfer the kernels between its start and done; on one
    stream the second cannot begin before the first ends, and then nothing is left to hide it."""
    tl = timeline.build(QUEUED)
    one = ring(256)
    s1, s2 = tl.of("transfer")
    assert (s1.start_s, s2.start_s, s2.end_s) == (0.0, pytest.approx(one), pytest.approx(2 * one))
    assert s2.args["queued_us"] == pytest.approx(one * 1e6)
    assert s2.args["hidden_us"] == 0 and tl.end_s == pytest.approx(2 * one)
    model = {e.name: e.hidden for e in overlap.estimate(QUEUED)}
    assert model["s2"] > 0  # what the per-collective model says, and the timeline does not


def test_loops_calls_and_conditionals_count_as_the_model_does() -> None:
    """CALLS: a 5-trip loop, a loop with no known trip count (once), conditionals (the longest
    branch) and a call; every kernel costs the floor."""
    unrolled = timeline.build(CALLS, unroll=5)
    folded = timeline.build(CALLS, unroll=4)
    upper = predict.predict(CALLS).upper_s
    assert unrolled.end_s == pytest.approx(upper) and folded.end_s == pytest.approx(upper)
    assert unrolled.totals()["kernels"] == folded.totals()["kernels"] == 9
    assert len(unrolled.of("kernel")) == 9 and len(folded.of("kernel")) == 5
    (rest,) = folded.of("folded")
    assert (rest.name, rest.seconds) == ("4 more trips of w", pytest.approx(4 * FLOOR))
    assert folded.loops == (
        "w: 5 trips, the first drawn and 4 folded",
        "w2: trip count unknown, run once (as the model counts it)",
    )


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_one_collective_in_flight_gives_the_models_numbers(path: Path) -> None:
    """Where the schedule keeps one collective in flight, each transfer's hidden part is the
    overlap model's and the step is the high end of the model's range (folded or unrolled)."""
    text = path.read_text()
    for unroll in (0, 100):
        tl = timeline.build(text, unroll=unroll)
        assert tl.end_s == pytest.approx(predict.predict(text).upper_s, rel=1e-9)
        assert tl.totals()["kernels"] == predict.predict(text).kernels
    tl = timeline.build(text, unroll=100)
    hidden = {s.name: s.args["hidden_us"] for s in tl.of("transfer", "sync")}
    for e in overlap.estimate(text):
        if e.mode == "async":
            assert hidden[e.name] == pytest.approx(e.hidden * e.transfer_s * 1e6, abs=1e-6)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_kit_model_transfers_are_the_overlap_models(path: Path) -> None:
    text = path.read_text()
    source = timeline.KitModel(text)
    by_name = {i.name: i for i in source.module.computations[source.module.entry]}
    by_name |= {i.name: i for c in source.module.computations.values() for i in c}
    for e in overlap.estimate(text):
        move = source.transfer(by_name[e.name])
        assert move is not None and move.seconds == pytest.approx(e.transfer_s, rel=1e-12)
        assert (move.kind, move.bytes, move.link_bytes) == (e.kind, e.bytes, e.link_bytes)


@dataclasses.dataclass
class Fixed:
    """A stand-in source: every kernel 2 us, every collective 10 us."""

    name: str = "fixed times"

    def kernel(self, inst: Instruction) -> timeline.KernelTime:
        return timeline.KernelTime(2e-6)

    def transfer(self, inst: Instruction) -> timeline.TransferTime | None:
        kind = inst.opcode.removesuffix("-start")
        return timeline.TransferTime(10e-6, kind, 0) if kind == "all-reduce" else None


def test_another_source_plugs_in() -> None:
    tl = timeline.build(ASYNC, source=Fixed())
    assert tl.source == "fixed times" and "(fixed times)" in tl.caption()
    assert tl.end_s == pytest.approx(20e-6)  # 10 us async (2 of it hidden), then 10 us sync
    assert tl.of("transfer")[0].args["hidden_us"] == pytest.approx(2.0)


def test_unscheduled_hlo_is_refused_with_what_to_pass() -> None:
    with pytest.raises(ValueError, match=r"not scheduled .* compiled.as_text\(\)"):
        timeline.build(ASYNC.replace(", is_scheduled=true", ""))


def test_picture_and_caption_say_modelled_with_the_numbers() -> None:
    tl = timeline.build(ASYNC, title="by hand")
    pic = timeline.picture(tl, timeline.build(SYNC, title="all sync"))
    root = ET.fromstring(pic.svg)
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "by hand (modelled, not measured, the kit's model (H100 SXM))" in titles
    assert "time from the step's start (us)" in titles
    lines = pic.caption.splitlines()
    assert lines[0].startswith("by hand: 10 us per step, modelled, not measured")
    assert "2 collectives (1 async, 1 sync)" in lines[0] and lines[1].startswith("all sync: ")
    tips = "\n".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title"))
    assert "bytes: 256" in tips and "modelled_us: 5.001" in tips and "flops: 0" in tips
    assert pic.title == "The step on one time axis (modelled)"
    assert tl._repr_mimebundle_()["text/plain"] == f"{pic.title}\n{tl.caption()}"
    assert timeline.picture(tl).svg in tl._repr_mimebundle_()["text/html"]  # inline, captioned
    rows = timeline.summary_rows([tl])
    assert rows[0]["timeline"] == "by hand" and rows[0]["step_us"] == 10.0


def test_picture_needs_a_timeline() -> None:
    with pytest.raises(ValueError, match="at least one timeline"):
        timeline.picture()


def test_marks_point_out_collectives_by_name() -> None:
    pic = timeline.picture(timeline.build(ASYNC), marks={"ars": "target", "ar": "the sync one"})
    bold = [
        t.text
        for t in ET.fromstring(pic.svg).iter("{http://www.w3.org/2000/svg}text")
        if "font-weight:bold" in (t.get("style") or "") and t.text in ("target", "the sync one")
    ]
    assert sorted(bold) == ["target", "the sync one"]
    assert 'stroke-width="2"' in pic.svg
