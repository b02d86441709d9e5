"""labkit.xla.xla_estimate: XLA's own estimate, composed per step, beside the kit's model.

The handwritten program and dump (tests/xla_schedule_fixture.py) have their numbers worked by
hand; one small real compile checks the reading against XLA itself.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P
from xla_schedule_fixture import (
    EXPOSED_US,
    KERNEL_US,
    LOOPED,
    LOOPED_SCHEDULE,
    OTHER_WAITS_US,
    STEP_US,
    TRANSFER_US,
)

from labkit.xla import hlo, predict, timeline, xla_estimate
from labkit.xla.xla_schedule import read_schedule


@pytest.fixture(scope="module")
def est() -> xla_estimate.XlaEstimate:
    return xla_estimate.estimate(read_schedule(LOOPED_SCHEDULE), LOOPED)


def test_step_is_the_entry_plus_trips_times_the_body(est: xla_estimate.XlaEstimate) -> None:
    assert est.per_step["body"] == 3 and est.per_step["main"] == 1
    assert est.step_us == pytest.approx(STEP_US)
    assert est.kernel_us == pytest.approx(KERNEL_US)
    assert est.transfer_us == pytest.approx(TRANSFER_US)
    assert est.exposed_us == pytest.approx(EXPOSED_US)
    assert est.other_waits_us == pytest.approx(OTHER_WAITS_US)
    # collective starts and dones (1 each, 4 pairs per step), the loop's own 0.01 and the
    # async fusion's start and done (0.01 each)
    assert est.other_ops_us == pytest.approx(3 * 2.0 + 2.0 + 0.01 + 0.02)
    assert est.kernels == 7 and est.unscheduled == ()
    parts = est.kernel_us + est.other_ops_us + est.exposed_us + est.other_waits_us
    assert parts == pytest.approx(est.step_us)  # the terms add up to XLA's step


def test_each_op_says_which_model_costed_it(est: xla_estimate.XlaEstimate) -> None:
    by = {o.name: o for o in est.ops}
    assert (by["g"].source, by["g"].us, by["g"].per_step) == (xla_estimate.MATMUL, 12.0, 3)
    assert (by["n"].source, by["n"].us) == (xla_estimate.PERF_MODEL, 0.5)
    assert by["c"].source == xla_estimate.FALLBACK and by["c"].flag.startswith("0.01 us")
    assert by["fs"].kind == "async" and by["fs"].flag.startswith("5000 us")
    # the entry's all-reduce window is short: the schedule, not its latency, set it
    entry_ar = next(o for o in est.ops if o.kind == "transfer" and o.computation == "main")
    assert entry_ar.us == pytest.approx(1.5) and entry_ar.note == xla_estimate.AT_MOST
    assert {o.name for o in est.flagged()} == {"c", "fs"}
    assert est.estimator == "unified SOL estimator"


def test_side_by_side_with_the_kit(est: xla_estimate.XlaEstimate) -> None:
    pred = predict.predict(LOOPED)
    rows = {r["term"]: r for r in xla_estimate.compare(LOOPED, est, pred=pred)}
    assert rows["kernels"]["kit"] == pred.kernels == rows["kernels"]["xla"] == 7
    assert rows["per-kernel floor"]["xla"] == 0.0
    assert rows["3 kernels by XLA's matmul interpolator"]["xla"] == 36.0
    assert rows["transfer"]["xla"] == predict.round_sig(TRANSFER_US)
    assert rows["step"]["xla"] == predict.round_sig(STEP_US)
    low, high = (predict.round_sig(x * 1e6) for x in (pred.lower_s, pred.upper_s))
    assert rows["step"]["kit"] == f"{low:g}-{high:g}"
    top = xla_estimate.disagreements(LOOPED, est, top=2)
    assert top[0]["op"] == "fs" and "5000" in str(top[0]["why"])  # the constant, named
    assert top[0]["kit us"] == 0.0  # the kit's model has no time for an async fusion


def test_float_noise_in_summed_times_shows_as_zero() -> None:
    """Schedule times summed per computation leave ~1e-14 us where XLA waited nothing: the
    side-by-side table shows 0 there, and two digits elsewhere."""
    assert xla_estimate._rounded_us(7.1e-14) == 0.0
    assert xla_estimate._rounded_us(-3e-12) == 0.0
    assert xla_estimate._rounded_us(0.0123) == 0.012
    assert xla_estimate._rounded_us(41.37) == 41.0


def test_xla_model_is_a_timeline_source(est: xla_estimate.XlaEstimate) -> None:
    source = xla_estimate.XlaModel(LOOPED, est)
    assert source.name.startswith("XLA's model")
    drawn = timeline.build(LOOPED, source, title="looped")
    t = drawn.totals()
    assert t["kernel_us"] == pytest.approx(est.kernel_us)  # every kernel at XLA's cost
    assert t["collectives"] == 4 and t["transfer_us"] == pytest.approx(est.transfer_us)
    # the picture has no bars for starts, dones or the async fusion: it ends before XLA's total
    assert t["step_us"] < est.step_us - OTHER_WAITS_US + 1e-6
    both = timeline.picture(timeline.build(LOOPED), drawn)
    assert "XLA's model" in both.caption and "the kit's model" in both.caption


def _program(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.tanh(x @ w).sum()


def test_a_real_compile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from labkit.xla.aot import abstract, compile_for_gpu, h100_mesh

    monkeypatch.setenv("LABKIT_CACHE_DIR", str(tmp_path))
    mesh = h100_mesh((8,), ("data",))
    x = abstract(jax.ShapeDtypeStruct((64, 128), jnp.float32), mesh, P("data"))
    w = abstract(jax.ShapeDtypeStruct((128, 128), jnp.float32), mesh, P())
    fn = jax.jit(_program)
    result, est = xla_estimate.compile_with_estimate(fn, x, w)
    assert est is not None and not result.from_cache
    (entry,) = est.computations.values()  # no loop: one schedule, the entry's
    assert est.step_us == pytest.approx(entry.total_us)
    assert entry.total_us == pytest.approx(entry.cost_us + sum(entry.wasted_us.values()))
    kit = predict.predict(result.hlo)
    assert est.kernels == kit.kernels and est.transfer_us > 0
    assert [o.kind for o in est.ops].count("transfer") == len(hlo.collectives(result.hlo))
    # the dump left the program as it is
    plain = compile_for_gpu(fn, x, w, cache=False)
    program = hlo.parse_module(plain.hlo).computations
    dumped = hlo.parse_module(result.hlo).computations
    assert {c: [(i.name, i.opcode, i.shape) for i in v] for c, v in program.items()} == {
        c: [(i.name, i.opcode, i.shape) for i in v] for c, v in dumped.items()
    }
    # a second call compiles nothing: the compile and the reading come from the cache
    again, est2 = xla_estimate.compile_with_estimate(fn, x, w)
    assert again.from_cache and est2 is not None and est2.ops == est.ops
    # nothing to schedule (no collective): XLA's scheduler writes no schedule
    solo = abstract(jax.ShapeDtypeStruct((64, 128), jnp.float32), mesh, P())
    _, none = xla_estimate.compile_with_estimate(jax.jit(jnp.tanh), solo)
    assert none is None
