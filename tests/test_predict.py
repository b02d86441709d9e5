"""labkit.xla.predict: the step-time range, on handwritten HLO with the terms worked by hand."""

from __future__ import annotations

import pytest
from hlo_programs import CALLS
from test_overlap import ALPHA, FLOOR, H100, HBM, LINK, PIPELINED, _gemm_between

from labkit.core.hardware import Latencies
from labkit.xla import hlo, predict


def test_one_gemm_beside_an_all_reduce() -> None:
    p = predict.predict(_gemm_between(1))
    flops = 2 * 1024**3
    math_s = flops / (H100.tf32_tflops * 1e12)  # f32 at DEFAULT precision runs as TF32
    memory_s = 2 * 4 * 2**20 / HBM  # one f32 1024x1024 read, one written
    kernel_s = max(FLOOR, math_s, memory_s)
    transfer = ALPHA + 2 * 7 / 8 * 2 * 2**20 / LINK
    exposed = transfer - kernel_s  # the GEMM runs while the all-reduce is in flight
    assert (p.kernels, p.collectives, p.num_devices) == (1, 1, 8)
    assert p.flops == pytest.approx(8 * flops)  # global: 8 devices
    assert (p.math_s, p.memory_s, p.floor_s) == (
        pytest.approx(math_s),
        pytest.approx(memory_s),
        pytest.approx(FLOOR),
    )
    assert (p.transfer_s, p.latency_s) == (pytest.approx(transfer), pytest.approx(ALPHA))
    assert p.exposed_s == pytest.approx(exposed)
    assert p.lower_s == pytest.approx(max(math_s, memory_s, exposed, FLOOR))
    assert p.upper_s == pytest.approx(kernel_s + exposed)
    low, high = p.tokens_per_s(1000)
    assert low == predict.round_sig(1000 / p.upper_s) and high >= low


def test_a_loop_counts_its_trips() -> None:
    module = hlo.parse_module(PIPELINED)
    # the body and the fusion it runs: 3 trips; the condition is tested once more
    assert predict.trip_multipliers(module) == {"main": 1, "body": 3, "cond": 4, "fused": 3}
    p = predict.predict(PIPELINED)
    # the body's dot fusion runs 3 times; the copy-start/done pair moves no kernel
    assert p.kernels == 3 and p.floor_s == pytest.approx(3 * FLOOR)
    assert p.collectives == 0 and p.exposed_s == 0


def test_multipliers_add_up_every_call() -> None:
    # body: 5 trips of w, then w2 (no trip count: once); cond: one test more per loop
    times = predict.trip_multipliers(hlo.parse_module(CALLS))
    assert (times["main"], times["body"], times["cond"]) == (1, 6, 8)
    # no: tf's false branch and br's branches (listed twice, one taken per call)
    assert (times["yes"], times["no"], times["add"]) == (2, 2, 1)
    assert times["neg"] == 6 + 2  # the fusion in body, the call in no


def test_rows_show_every_term_rounded() -> None:
    rows = predict.predict(_gemm_between(2)).rows()
    terms = [r["term"] for r in rows]
    assert terms[0] == "kernels" and terms[-2:] == [predict.RANGE_LOW, predict.RANGE_HIGH]
    assert all("bound" not in t for t in terms)  # a model's range, not bounds
    assert {"math", "memory", "floors", "exposed communication"} <= set(terms)
    assert predict.round_sig(123456.0) == 120000.0 and predict.round_sig(0.0123) == 0.012
    assert "kernels x floor" in predict.formula() and "sum t_k" in predict.formula()


def test_sensitivity_scales_the_two_guessed_constants() -> None:
    text = _gemm_between(2)
    rows = predict.sensitivity(text, factors=(1.0, 2.0, 4.0))
    by = {(r["kernel_floor_us"], r["collective_us"]): r for r in rows}
    assert len(rows) == 7  # both at once x3, then each alone x2 more each
    base = predict.predict(text)
    assert by[1.0, 5.0]["high_us"] == predict.round_sig(base.upper_s * 1e6)
    for f in (2.0, 4.0):  # worked by hand: the model with the constants replaced
        lat = Latencies(FLOOR * 1e6 * f, ALPHA * 1e6 * f, "test")
        p = predict.predict(text, latencies=lat)
        assert by[f, 5.0 * f]["low_us"] == predict.round_sig(p.lower_s * 1e6)
        assert by[f, 5.0 * f]["high_us"] == predict.round_sig(p.upper_s * 1e6)
    highs = [by[f, 5.0 * f]["high_us"] for f in (1.0, 2.0, 4.0)]
    assert highs == sorted(highs) and highs[0] < highs[-1]  # more cost, a longer step
