"""labkit.xla.overlap and the pairing fixes: handwritten HLO with exact answers, and real
compiled H100 programs (the tiny GPT data-parallel step, default and threshold 0)."""

from __future__ import annotations

import dataclasses

import pytest
from hlo_programs import ASYNC

from labkit.core.hardware import LATENCIES, hardware
from labkit.xla import compare, hlo, overlap

H100 = hardware("H100 SXM")
LINK = H100.nvlink_gbps / 2 * 1e9  # bytes/s, one direction  # type: ignore[operator]
HBM = H100.hbm_gbps * 1e9
ALPHA = 5e-6  # XLA's per-collective estimate (kNcclKernelLaunchOverhead)
FLOOR = 1e-6  # XLA's per-kernel estimate (kKernelLaunchOverhead)

# A recv pipelined across iterations: the body waits for the recv that the previous
# iteration started (recv-done of a get-tuple-element of the loop parameter) and starts the
# next one; a copy-start/copy-done pair is async but no collective.
PIPELINED = """\
HloModule piped, is_scheduled=true, num_partitions=2

%fused (x: f32[64,64]) -> f32[64,64] {
  %x = f32[64,64]{1,0} parameter(0)
  ROOT %d = f32[64,64]{1,0} dot(%x, %x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (p: (f32[64,64], (f32[16], u32[], token[]))) -> (f32[64,64], (f32[16], u32[], token[])) {
  %p = (f32[64,64]{1,0}, (f32[16]{0}, u32[], token[])) parameter(0)
  %prev = (f32[16]{0}, u32[], token[]) get-tuple-element(%p), index=1
  %rd = (f32[16]{0}, token[]) recv-done(%prev), channel_id=1
  %tok = token[] after-all()
  %r = (f32[16]{0}, u32[], token[]) recv(%tok), channel_id=1
  %v = f32[16]{0} get-tuple-element(%rd), index=0
  %cs = (f32[16]{0}, f32[16]{0}, u32[]) copy-start(%v)
  %w = f32[64,64]{1,0} get-tuple-element(%p), index=0
  %g = f32[64,64]{1,0} fusion(%w), kind=kOutput, calls=%fused
  %cd = f32[16]{0} copy-done(%cs)
  ROOT %t = (f32[64,64]{1,0}, (f32[16]{0}, u32[], token[])) tuple(%g, %r)
}

%cond (q: (f32[64,64], (f32[16], u32[], token[]))) -> pred[] {
  %q = (f32[64,64]{1,0}, (f32[16]{0}, u32[], token[])) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: f32[64,64]) -> f32[64,64] {
  %a = f32[64,64]{1,0} parameter(0)
  %tok0 = token[] after-all()
  %r0 = (f32[16]{0}, u32[], token[]) recv(%tok0), channel_id=1
  %init = (f32[64,64]{1,0}, (f32[16]{0}, u32[], token[])) tuple(%a, %r0)
  %loop = (f32[64,64]{1,0}, (f32[16]{0}, u32[], token[])) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %out = (f32[16]{0}, u32[], token[]) get-tuple-element(%loop), index=1
  %last = (f32[16]{0}, token[]) recv-done(%out), channel_id=1
  ROOT %res = f32[64,64]{1,0} get-tuple-element(%loop), index=0
}
"""  # noqa: E501


def _gemm_between(n_dots: int) -> str:
    """An all-reduce-start of 2 MiB (bf16) with ``n_dots`` f32 1024^3 matmuls before its done."""
    dots = "\n".join(
        f"  %g{i} = f32[1024,1024]{{1,0}} fusion(%w), kind=kCustom, calls=%mm"
        for i in range(n_dots)
    )
    return f"""\
HloModule gemm, is_scheduled=true, num_partitions=8

%add (x: bf16[], y: bf16[]) -> bf16[] {{
  %x = bf16[] parameter(0)
  %y = bf16[] parameter(1)
  ROOT %s = bf16[] add(%x, %y)
}}

%mm (m: f32[1024,1024]) -> f32[1024,1024] {{
  %m = f32[1024,1024]{{1,0}} parameter(0)
  ROOT %d = f32[1024,1024]{{1,0}} dot(%m, %m), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}

ENTRY %main (a: bf16[1024,1024], w: f32[1024,1024]) -> bf16[1024,1024] {{
  %a = bf16[1024,1024]{{1,0}} parameter(0)
  %w = f32[1024,1024]{{1,0}} parameter(1)
  %ars = ((bf16[1024,1024]{{1,0}}), bf16[1024,1024]{{1,0}}) all-reduce-start(%a), replica_groups={{}}, to_apply=%add
{dots}
  ROOT %ard = bf16[1024,1024]{{1,0}} all-reduce-done(%ars)
}}
"""  # noqa: E501


def test_done_of_a_loop_parameter_is_no_pair() -> None:
    pairs = hlo.async_pairs(PIPELINED)
    assert [(p.start, p.done, p.kind, p.is_collective) for p in pairs] == [
        ("cs", "cd", "copy", False)
    ]
    assert pairs[0].ops_between == ["w", "g"] and pairs[0].compute_between == 1
    s = hlo.summary(PIPELINED)
    assert (s["async_pairs"], s["pairs_with_compute_between"]) == (0, 0)  # copies filtered
    assert compare.across_iterations(PIPELINED) == ["rd", "r"]  # not the entry's r0 / last
    m = compare.metrics(PIPELINED)
    assert (m["transfers across loop iterations"], m["send/recv pairs"]) == (2, 0)
    assert overlap.estimate(PIPELINED) == []  # no collective, no send/recv pair


def test_link_bytes_model() -> None:
    assert overlap.link_bytes("all-reduce", 800, 8) == pytest.approx(2 * 7 / 8 * 800)
    assert overlap.link_bytes("all-gather", 800, 8) == pytest.approx(7 / 8 * 800)
    assert overlap.link_bytes("reduce-scatter", 800, 4) == pytest.approx(3 / 4 * 800)
    assert overlap.link_bytes("collective-permute", 800, None) == 800
    assert overlap.link_bytes("all-reduce", 800, 1) == 0  # alone: nothing to send


def test_the_latencies_are_xla_s_own_estimates() -> None:
    assert (LATENCIES.collective_us, LATENCIES.kernel_floor_us) == (5.0, 1.0)
    assert "gpu_performance_model_base.h" in LATENCIES.source
    text = overlap.formula()
    assert "5 us" in text and "1 us" in text and "450 GB/s" in text and "3350 GB/s" in text


def test_a_scalar_fusion_hides_a_floor_of_a_small_all_reduce() -> None:
    ars, ar = overlap.estimate(ASYNC)  # 256-byte async all-reduce; 32-byte sync one
    wire = 2 * 7 / 8 * 256 / LINK  # 1 ns: the latency is the whole cost
    assert (ars.latency_s, ars.wire_s) == (pytest.approx(ALPHA), pytest.approx(wire))
    assert ars.transfer_s == pytest.approx(ALPHA + wire)
    assert (ars.mode, ars.kernels, ars.matmuls, ars.flops) == ("async", 1, 0, 0)
    assert ars.hbm_bytes == 64  # f32[8] in + out
    assert ars.compute_s == pytest.approx(FLOOR)  # 64 B / HBM is 0.02 ns: the floor rules
    assert ars.hidden == pytest.approx(FLOOR / (ALPHA + wire)) and ars.verdict == "partly hidden"
    assert (ar.mode, ar.hidden, ar.verdict) == ("sync", 0.0, "exposed")
    assert ar.transfer_s == pytest.approx(ALPHA + 2 * 7 / 8 * 32 / LINK)
    assert overlap.verdicts([ars, ar]) == {"hidden": 0, "partly hidden": 1, "exposed": 1}
    no_latency = dataclasses.replace(LATENCIES, collective_us=0.0, kernel_floor_us=0.0)
    (bare, _) = overlap.estimate(ASYNC, latencies=no_latency)
    assert bare.transfer_s == pytest.approx(wire) and bare.compute_s == pytest.approx(64 / HBM)


@pytest.mark.parametrize(("dots", "verdict"), [(0, "exposed"), (1, "partly hidden"), (4, "hidden")])
def test_gemms_between_hide_the_transfer(dots: int, verdict: str) -> None:
    (e,) = overlap.estimate(_gemm_between(dots))
    transfer = ALPHA + 2 * 7 / 8 * 2 * 2**20 / LINK  # ring all-reduce of 2 MiB among 8
    flops = 2 * 1024**3  # per dot; f32 at DEFAULT precision: the TF32 peak
    per_dot = max(FLOOR, flops / (H100.tf32_tflops * 1e12), 2 * 4 * 2**20 / HBM)
    assert e.transfer_s == pytest.approx(transfer) and e.bytes == 2 * 2**20
    assert (e.matmuls, e.flops) == (dots, dots * flops)
    assert e.compute_s == pytest.approx(dots * per_dot)
    assert e.hidden == pytest.approx(min(1.0, dots * per_dot / transfer))
    assert e.verdict == verdict
    t = overlap.totals([e])
    assert t["transfer_us"] == pytest.approx(transfer * 1e6)
    assert t["latency_us"] == pytest.approx(ALPHA * 1e6)
    assert t["hidden_us"] + t["exposed_us"] == pytest.approx(t["transfer_us"])


def test_rows_and_a_slower_link() -> None:
    (fast,) = overlap.estimate(_gemm_between(1))
    (slow,) = overlap.estimate(_gemm_between(1), link_gbps=45.0)  # 10x slower than NVLink
    assert slow.wire_s == pytest.approx(10 * fast.wire_s) and slow.verdict == "exposed"
    (row,) = overlap.rows([fast])
    assert row["verdict"] == "partly hidden" and row["matmuls"] == 1 and row["hidden"].endswith("%")
    assert row["latency_us"] == 5.0
    no_link = dataclasses.replace(H100, nvlink_gbps=None)
    with pytest.raises(ValueError, match="link_gbps"):
        overlap.estimate(ASYNC, no_link)


# A fusion that slices a 1 MiB buffer it is given whole: it reads the slice, not the buffer.
SLICES = """\
HloModule slices, is_scheduled=true

%wrapped (p: f32[262144], q: f32[16]) -> f32[1024] {
  %p = f32[262144]{0} parameter(0)
  %q = f32[16]{0} parameter(1)
  %s = f32[1024]{0} slice(%p), slice={[0:1024]}
  ROOT %a = f32[1024]{0} add(%s, %s)
}

%plain (p: f32[262144]) -> f32[262144] {
  %p = f32[262144]{0} parameter(0)
  ROOT %n = f32[262144]{0} negate(%p)
}

ENTRY %main (x: f32[262144], y: f32[16]) -> (f32[1024], f32[262144]) {
  %x = f32[262144]{0} parameter(0)
  %y = f32[16]{0} parameter(1)
  %f = f32[1024]{0} fusion(%x, %y), kind=kLoop, calls=%wrapped
  %g = f32[262144]{0} fusion(%x), kind=kLoop, calls=%plain
  ROOT %t = (f32[1024]{0}, f32[262144]{0}) tuple(%f, %g)
}
"""


def test_a_fusion_that_slices_a_buffer_is_charged_the_slice() -> None:
    module = hlo.parse_module(SLICES)
    f, g = (module.computations["main"][i] for i in (2, 3))
    # slice: 4 KiB read of x + the 64 B of y (used whole) + 4 KiB written
    assert overlap.kernel_cost(module, f, H100).hbm_bytes == 4096 + 64 + 4096
    assert overlap.kernel_cost(module, g, H100).hbm_bytes == 2 * 262144 * 4  # all of x, twice
    total = overlap.computation_cost(module, "main", H100)
    assert (total.kernels, total.floor_s) == (2, pytest.approx(2 * FLOOR))
    assert total.seconds == pytest.approx(FLOOR + max(FLOOR, 2 * 262144 * 4 / HBM))


@pytest.mark.aot
def test_default_dp_all_reduce_has_only_two_scalar_kernels_beside_it() -> None:
    from labkit.gpt.compile import compile_train_step

    text = compile_train_step("tiny", "dp").hlo  # XLA's default program
    (e,) = overlap.estimate(text)  # every gradient and the loss in one all-reduce
    assert (e.kind, e.mode, e.bytes) == ("all-reduce", "async", 543236)
    # after the whole backward pass: only the two scalar Adam step-count fusions in between,
    # each a floor: 2 us of the all-reduce's 5 us latency + 2.1 us on the wire
    assert (e.kernels, e.matmuls) == (2, 0) and e.compute_s == pytest.approx(2 * FLOOR)
    assert e.transfer_s == pytest.approx(ALPHA + 2 * 7 / 8 * 543236 / LINK)
    assert e.verdict == "partly hidden" and e.hidden < 0.3


@pytest.mark.aot
def test_threshold_zero_pays_one_latency_per_gradient() -> None:
    from labkit.gpt.compile import compile_train_step

    opts = {"xla_gpu_all_reduce_combine_threshold_bytes": 0}
    text = compile_train_step("tiny", "dp", opts).hlo
    found = overlap.estimate(text)
    assert len(found) == 26 and sum(e.mode == "async" for e in found) == 25
    v = overlap.verdicts(found)
    assert v["exposed"] >= 1 and v["hidden"] > 0 and v["partly hidden"] > v["hidden"]
    assert sum(e.matmuls > 0 for e in found) >= 10  # backward GEMMs between start and done
    t = overlap.totals(found)
    default = overlap.totals(overlap.estimate(compile_train_step("tiny", "dp").hlo))
    assert t["latency_us"] == pytest.approx(26 * ALPHA * 1e6)  # one alpha per all-reduce
    assert t["transfer_us"] - t["latency_us"] == pytest.approx(
        default["transfer_us"] - default["latency_us"], rel=1e-3
    )  # the same bytes on the wire
    assert t["exposed_us"] > 5 * default["exposed_us"]  # 25 more latencies than one merged
