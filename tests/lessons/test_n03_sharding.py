"""labkit.lessons.n03_sharding: partitioner switch, matmul plans, GPT accounting, checkers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from labkit import sharding
from labkit.core.mesh import make_mesh
from labkit.core.widgets import shown_text
from labkit.lessons import n03_sharding as lesson


def _lowered(x_spec: P) -> str:
    mesh = make_mesh((8,), ("x",))
    x = jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=NamedSharding(mesh, x_spec))
    return jax.jit(jnp.tanh).lower(x).as_text()


def test_partitioner_switches_and_restores() -> None:
    before = jax.config.jax_use_shardy_partitioner
    assert before, "Shardy is this jax's default partitioner (03 teaches it)"
    with lesson.partitioner("gspmd"):
        gspmd = _lowered(P("x"))
        assert not jax.config.jax_use_shardy_partitioner
    assert jax.config.jax_use_shardy_partitioner == before
    assert lesson.which_partitioner(gspmd) == "gspmd"
    with lesson.partitioner("shardy"):
        shardy = _lowered(P("x"))
    assert lesson.which_partitioner(shardy) == "shardy"
    assert lesson.which_partitioner("func.func @main()") == "none"
    assert any(line.startswith("sdy.sharding") for line in lesson.sharding_lines(shardy))
    assert lesson.sharding_lines(gspmd) == ['mhlo.sharding = "{devices=[8,1]<=[8]}"']
    with pytest.raises(ValueError, match="shardy' or 'gspmd"):
        with lesson.partitioner("alpa"):
            pass


def test_partitioner_restores_after_an_error() -> None:
    before = jax.config.jax_use_shardy_partitioner
    with pytest.raises(RuntimeError), lesson.partitioner("gspmd"):
        raise RuntimeError("boom")
    assert jax.config.jax_use_shardy_partitioner == before


def test_matmul_plan_contracting_dimension() -> None:
    plan = lesson.matmul_plan({"x": 8}, (None, "x"), ("x", None))
    assert [(r["kind"], r["bytes"], r["group"]) for r in plan.collectives] == [
        ("all-reduce", 256 * 256 * 4, 8)
    ]
    assert plan.sent_per_device == round(2 * 7 / 8 * 256 * 256 * 4)
    assert plan.specs[2] == P()  # the partitioner chose a replicated output
    assert "all-reduce" in plan.text() and set(plan.layouts) == {"x", "w", "out"}


def test_matmul_plan_without_collectives_and_2d_mesh() -> None:
    plan = lesson.matmul_plan({"x": 8}, ("x", None), (None, None))
    assert plan.collectives == [] and "no collectives" in plan.text()
    two = lesson.matmul_plan({"x": 4, "y": 2}, ("x", "y"), ("y", None), out_spec=("x", None))
    assert [(r["kind"], r["group"]) for r in two.collectives] == [("all-reduce", 2)]
    with pytest.raises(ValueError, match="target"):
        lesson.compile_matmul({"x": 8}, P(), P(), target="tpu")


def test_matmul_explorer_builds() -> None:
    widget = lesson.matmul_explorer()
    assert len(widget.children) == 3
    assert lesson._parse_spec("None, x") == (None, "x")
    out = widget.children[2]
    assert "bytes sent per device: 0" in shown_text(out)  # rows of x: no collective
    assert out.msg_id == ""  # nothing captured: papermill has nothing to send back


def test_collective_matmul_matches_numpy() -> None:
    mesh = make_mesh((8,), ("x",))
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((32, 16)).astype(np.float32)
    specs = {"mesh": mesh, "in_specs": (P("x", None), P(None, "x")), "out_specs": P(None, "x")}
    for fn in (lesson.allgather_matmul, lesson.collective_matmul):
        got = jax.jit(jax.shard_map(fn, **specs))(x, w)
        np.testing.assert_allclose(np.asarray(got), x @ w, rtol=1e-4, atol=1e-4)


def test_gpt_params_and_predictions() -> None:
    params = lesson.gpt_params("tiny")
    assert params["tok_embed/embedding"] == (("vocab", "embed"), (256, 64), 4)
    dp = sharding.gradient_sync_bytes(params, "dp", {"data": 8})
    total = sum(np.prod(shape) * size for _, shape, size in params.values())
    assert dp == {"all-reduce": pytest.approx(2 * 7 / 8 * total)}
    acts = lesson.tp_activation_bytes("tiny", 32, {"data": 4, "model": 2})
    assert acts == 4 * 2 * (32 // 4 * 64 * 64 * 4)  # 4 per layer, each 2(1/2) of the buffer
    assert lesson.tp_activation_bytes("tiny", 32, {"data": 8}) == 0.0


def test_auto_sharding_evidence() -> None:
    evidence = lesson.auto_sharding_evidence()
    assert evidence["jax.sharding.AUTO"] is False
    assert isinstance(evidence["jax files that set it"], list)


def test_check_one_all_reduce() -> None:
    assert lesson.check_one_all_reduce(((None, "x"), ("x", None))).passed
    wrong = lesson.check_one_all_reduce((("x", None), (None, None)))
    assert not wrong.passed and wrong.attempted and "no collectives" in wrong.message
    bad = lesson.check_one_all_reduce("x")
    assert not bad.passed and bad.attempted
    assert not lesson.check_one_all_reduce(...).attempted


def test_check_ring_bytes() -> None:
    assert lesson.check_ring_bytes(7340032).passed
    assert lesson.check_ring_bytes(7.34e6).passed  # the right formula, rounded as learners do
    assert not lesson.check_ring_bytes(7.3e6).passed  # 0.5% off: not the formula
    assert not lesson.check_ring_bytes(2 * 7 / 8 * 4e6).passed  # 4 MB, not 4 MiB
    wrong = lesson.check_ring_bytes(4 * 2**20)
    assert not wrong.passed and wrong.attempted and "reduce-scatter" in wrong.message
    assert not lesson.check_ring_bytes(...).attempted


def test_check_tp_all_reduces() -> None:
    assert lesson.check_tp_all_reduces(24).passed
    wrong = lesson.check_tp_all_reduces(12)
    assert not wrong.passed and wrong.attempted
    assert not lesson.check_tp_all_reduces(...).attempted
