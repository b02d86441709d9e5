"""labkit.lessons.n03_sharding: partitioner switch, matmul plans, GPT accounting, checkers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hlo_programs import FUSED, HEADER
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from labkit.core.mesh import make_mesh
from labkit.core.widgets import shown_text
from labkit.gpt.config import GPTConfig
from labkit.lessons import n03_sharding as lesson
from labkit.parallel import sharding
from labkit.xla import hlo


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
    plan = lesson.ShardedMatmul({"x": 8}, (None, "x"), ("x", None)).plan()
    assert [(r["kind"], r["bytes"], r["group"]) for r in plan.collectives] == [
        ("all-reduce", 256 * 256 * 4, 8)
    ]
    assert plan.sent_per_device == round(2 * 7 / 8 * 256 * 256 * 4)
    assert plan.specs[2] == P()  # the partitioner chose a replicated output
    assert "all-reduce" in plan.text() and set(plan.layouts) == {"x", "w", "out"}


def test_matmul_plan_without_collectives_and_2d_mesh() -> None:
    plan = lesson.ShardedMatmul({"x": 8}, ("x", None), (None, None)).plan()
    assert plan.collectives == [] and "no collectives" in plan.text()
    two = lesson.ShardedMatmul(
        {"x": 4, "y": 2}, ("x", "y"), ("y", None), out_spec=("x", None)
    ).plan()
    assert [(r["kind"], r["group"]) for r in two.collectives] == [("all-reduce", 2)]
    with pytest.raises(ValueError, match="target"):
        lesson.ShardedMatmul({"x": 8}, P(), P(), target="tpu")


def test_matmul_explorer_builds() -> None:
    widget = lesson.matmul_explorer()
    assert len(widget.children) == 3
    assert lesson._parse_spec("None, x") == (None, "x")
    out = widget.children[2]
    assert "bytes sent per device: 0" in shown_text(out)  # rows of x: no collective
    assert out.msg_id == ""  # nothing captured: papermill has nothing to send back
    page = out.outputs[0]["data"]["text/html"]  # the grids, rendered, not ASCII boxes
    assert page.count('class="labkit-block"') == 8 + 1 + 8 and "no collectives" in page
    assert "+---" not in page and "|---" not in page


def test_matmul_plan_picture_draws_the_three_layouts() -> None:
    plan = lesson.ShardedMatmul({"x": 4, "y": 2}, ("x", "y"), ("y", None)).plan()
    shown = plan.picture()
    assert shown.title == "x @ w on a mesh of x 4 x y 2: all-reduce"
    # x: 4 x 2 blocks, one device each; w: 2 x 1 blocks on 4 devices; out: 4 x 1 on 2
    assert [shown.svg.count(f'data-block="{b}"') for b in ("0,0", "3,1", "1,0")] == [3, 1, 3]
    assert "x (256, 512) ('x', 'y'): 4 x 2 blocks, each on 1 device(s)" in shown.caption
    assert "w (512, 256) ('y', None): 2 x 1 blocks, each on 4 device(s)" in shown.caption
    assert f"each device sends {plan.sent_per_device} bytes" in shown.caption
    assert plan.grids["w"] == sharding.layout_grid((512, 256), P("y", None), {"x": 4, "y": 2})
    page = plan.html()
    assert '<table class="labkit-table">' in page and "all-reduce" in page


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


def test_check_scatter_on_h100_compiles_both() -> None:
    right = (("data", "model"), ("model", None), ("data", "model"))
    assert lesson.check_scatter_on_h100(right).passed
    # the output left to the partitioner: an all-reduce on both backends
    wrong = lesson.check_scatter_on_h100(((None, "model"), ("model", None), None))
    assert not wrong.passed and wrong.attempted and "all-reduce" in wrong.message
    bad = lesson.check_scatter_on_h100((("x", None), (None, None)))
    assert not bad.passed and bad.attempted and "three specs" in bad.message
    assert not lesson.check_scatter_on_h100(...).attempted


def test_check_ring_bytes() -> None:
    assert lesson.check_ring_bytes(7340032).passed
    assert lesson.check_ring_bytes(7.34e6).passed  # the right formula, rounded as learners do
    assert not lesson.check_ring_bytes(7.3e6).passed  # 0.5% off: not the formula
    assert not lesson.check_ring_bytes(2 * 7 / 8 * 4e6).passed  # 4 MB, not 4 MiB
    wrong = lesson.check_ring_bytes(4 * 2**20)
    assert not wrong.passed and wrong.attempted and "reduce-scatter" in wrong.message
    assert not lesson.check_ring_bytes(...).attempted


def test_check_tp_activation_bytes() -> None:
    cfg = GPTConfig.preset("tiny")
    shard = 16 * cfg.seq_len * cfg.d_model * 4  # batch 32 over data 2, f32
    right = 4 * cfg.num_layers * 2 * 3 / 4 * shard  # ring all-reduce over 4: 2(n-1)/n
    assert lesson.check_tp_activation_bytes(right).passed
    degree_2 = 4 * cfg.num_layers * 2 * 1 / 2 * (8 * cfg.seq_len * cfg.d_model * 4)
    wrong = lesson.check_tp_activation_bytes(degree_2)  # section 5's mesh, not this one
    assert not wrong.passed and wrong.attempted
    assert not lesson.check_tp_activation_bytes(...).attempted


def test_pass_trace_shows_propagation_then_partitioning() -> None:
    import tempfile
    from pathlib import Path

    mesh = make_mesh((8,), ("x",))
    x = jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=NamedSharding(mesh, P(None, "x")))
    w = jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=NamedSharding(mesh, P("x", None)))

    def matmul(a, b):
        return a @ b

    before = set(Path(tempfile.gettempdir()).glob("labkit-passes-*"))
    trace = lesson.pass_trace(matmul, x, w)
    assert set(Path(tempfile.gettempdir()).glob("labkit-passes-*")) == before  # removed
    assert trace.passes("spmd-partitioner") == ["shardy-xla", "spmd-partitioning"]
    assert lesson.entry_parameters(trace.after("shardy-xla")) == ["f32[16,8]", "f32[8,4]"]
    assert lesson.entry_parameters(trace.after("spmd-partitioning")) == ["f32[16,1]", "f32[1,4]"]
    assert hlo.collective_counts(trace.after("spmd-partitioning")) == {"all-reduce": 1}
    assert trace.first("all-reduce")[0] in ("spmd-partitioner", "spmd-cleanup")
    with pytest.raises(KeyError, match="did not change"):
        trace.after("no-such-pass")
    with pytest.raises(KeyError, match="no pass made"):
        trace.first("all-to-all")
    with pytest.raises(ValueError, match="no per-pass dump"):
        lesson.pass_trace(matmul, x, w, module="jit_other")
    plan = lesson.ShardedMatmul({"x": 8}, (None, "x"), ("x", None)).pass_trace()
    assert plan.passes("spmd-partitioner") == ["shardy-xla", "spmd-partitioning"]


# An all-reduce made synchronous (ar) whose independent kernels (a dot and a fusion) were
# scheduled inside another all-reduce's start..done (ars); e and a2 run before ars.
BESIDE = (
    HEADER
    + FUSED
    + """

ENTRY %main (a: f32[64], b: f32[8], c: f32[4,4]) -> (f32[64], f32[8], f32[4,4], f32[8], f32[8]) {
  %a = f32[64]{0} parameter(0)
  %b = f32[8]{0} parameter(1)
  %c = f32[4,4]{1,0} parameter(2)
  %ar = f32[8]{0} all-reduce(%b), replica_groups=[4,2]<=[8], to_apply=%add, metadata={op_name="jit(step)/jvp()/dot_general"}, backend_config={"collective_backend_config":{"is_sync":true}}
  %e = f32[8]{0} negate(%b)
  %a2 = f32[64]{0} negate(%a)
  %ars = ((f32[64]{0}), f32[64]{0}) all-reduce-start(%a2), replica_groups={}, to_apply=%add, metadata={op_name="jit(step)/transpose(jvp())/dot_general"}, backend_config={"collective_backend_config":{"is_sync":false}}
  %d = f32[4,4]{1,0} dot(%c, %c), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %f = f32[8]{0} fusion(%b), kind=kLoop, calls=%fused
  %ard = f32[64]{0} all-reduce-done(%ars)
  ROOT %t = (f32[64]{0}, f32[8]{0}, f32[4,4]{1,0}, f32[8]{0}, f32[8]{0}) tuple(%ard, %ar, %d, %f, %e)
}
"""  # noqa: E501
)


def test_beside_rows_counts_what_could_run_beside_each_all_reduce() -> None:
    sync, pair = lesson.beside_rows(BESIDE)
    assert (sync["collective"], sync["pass"], sync["group"], sync["mode"]) == (
        "ar",
        "forward",
        2,
        "sync",
    )
    # e, a2, d and f neither feed ar nor use it; d and f sit inside ars's start..done
    assert (sync["between"], sync["independent"], sync["gemms"], sync["in_other_windows"]) == (
        0,
        4,
        1,
        2,
    )
    assert (pair["pass"], pair["group"], pair["mode"], pair["between"]) == (
        "backward",
        8,
        "async",
        2,
    )
    assert (pair["independent"], pair["gemms"], pair["in_other_windows"]) == (3, 1, 0)
    assert lesson.beside_rows(BESIDE, kind="all-gather") == []


def test_most_in_flight_counts_overlapping_windows() -> None:
    assert lesson.most_in_flight(BESIDE) == 1  # ar is synchronous: only ars's window
    assert lesson.most_in_flight(BESIDE, kind="all-gather") == 0
    # ar made asynchronous, started inside ars's window and done after it: two in flight
    two = BESIDE.replace(
        "%ar = f32[8]{0} all-reduce(%b)", "%ar0 = ((f32[8]{0}), f32[8]{0}) all-reduce-start(%b)"
    ).replace('"is_sync":true', '"is_sync":false')
    lines = two.splitlines()
    start = next(k for k, ln in enumerate(lines) if "%ar0 =" in ln)
    moved = lines.pop(start)
    lines.insert(next(k for k, ln in enumerate(lines) if "%d = " in ln), moved)
    done = next(k for k, ln in enumerate(lines) if "%ard =" in ln)
    lines.insert(done + 1, "  %ar = f32[8]{0} all-reduce-done(%ar0)")
    assert lesson.most_in_flight("\n".join(lines)) == 2


def test_kernels_before() -> None:
    assert lesson.kernels_before(BESIDE, "ars") == {"before": 2, "needed": 1, "kernels": 4}
    assert lesson.kernels_before(BESIDE, "ar") == {"before": 0, "needed": 0, "kernels": 4}


def test_memory_rows_put_the_kit_state_beside_the_compiler() -> None:
    from types import SimpleNamespace

    x = jax.ShapeDtypeStruct((1000,), jnp.float32)
    compiled = jax.jit(lambda a: a * 2).lower(x).compile()
    (row,) = lesson.memory_rows({"toy": SimpleNamespace(compiled=compiled)}, {"toy": 4000})
    assert row["program"] == "toy" and row["kit: params + Adam MB"] == 0.0
    assert row["argument MB"] == round(4000 / 1e6, 2) and "temp MB" in row


# A scan-like step: a forward loop (3 trips) whose body all-gathers, and an all-reduce outside.
LOOP = """\
HloModule m, is_scheduled=true, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%cond (c: (s32[], f32[8])) -> pred[] {
  %c = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %v = f32[8]{0} get-tuple-element(%p), index=1
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  %ag = f32[64]{0} all-gather(%v), replica_groups=[1,8]<=[8], dimensions={0}, metadata={op_name="jit(step)/jvp()/while/body/dot_general"}
  %sl = f32[8]{0} slice(%ag), slice={[0:8]}
  ROOT %t = (s32[], f32[8]{0}) tuple(%j, %sl)
}

ENTRY %main (a: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8]{0}) tuple(%zero, %a)
  %w = (s32[], f32[8]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %out = f32[8]{0} get-tuple-element(%w), index=1
  ROOT %ar = f32[8]{0} all-reduce(%out), replica_groups={}, to_apply=%add, metadata={op_name="jit(step)/transpose(jvp())/add"}
}
"""  # noqa: E501


def test_collective_runs_count_loop_trips() -> None:
    runs = {r["collective"]: r for r in lesson.collective_runs(LOOP)}
    assert {n: (r["kind"], r["pass"], r["bytes"], r["runs"]) for n, r in runs.items()} == {
        "ag": ("all-gather", "forward", 256, 3),
        "ar": ("all-reduce", "backward", 32, 1),
    }
    unknown = LOOP.replace(', backend_config={"known_trip_count":{"n":"3"}}', "")
    with pytest.raises(ValueError, match="no trip count"):
        lesson.collective_runs(unknown)


def test_scanned_fsdp_mlp_gathers_per_layer() -> None:
    layers, d_model, d_ff = 3, 64, 128
    step = lesson.scanned_fsdp_mlp(layers, d_model, d_ff, batch_size=16)
    rows = lesson.collective_runs(step.hlo)
    layer_bytes = 2 * d_model * d_ff * 4
    looped = sorted((r["kind"], r["pass"], r["bytes"], r["runs"]) for r in rows if r["runs"] > 1)
    assert looped == [
        ("all-gather", "backward", layer_bytes, layers),  # the backward loop fetches it again
        ("all-gather", "forward", layer_bytes, layers),
        ("reduce-scatter", "backward", layer_bytes, layers),
    ]
    assert [(r["kind"], r["bytes"]) for r in rows if r["runs"] == 1] == [("all-reduce", 4)]
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    w = np.ones((2, 4, 4), np.float32), np.ones((2, 4, 4), np.float32)
    expected = x
    for _ in range(2):
        expected = expected + np.maximum(expected @ np.ones((4, 4)), 0) @ np.ones((4, 4))
    np.testing.assert_allclose(np.asarray(lesson.mlp_layers(w, x)), expected, rtol=1e-5)


def test_fsdp_bytes_prediction() -> None:
    assert lesson.check_fsdp_bytes("same").passed and lesson.check_fsdp_bytes("equal").passed
    assert "Gathered again for the backward pass it would be 1.50" in (
        lesson.check_fsdp_bytes("same").message
    )
    wrong = lesson.check_fsdp_bytes("more")
    assert wrong.attempted and not wrong.passed and "ring" in wrong.message


def test_window_rows_list_the_kernels_between_start_and_done() -> None:
    from labkit.xla import overlap

    rows = lesson.window_rows(BESIDE, "ars")
    assert [(r["kernel"], r["output"], r["matmul"], r["dynamic update"]) for r in rows] == [
        ("d", "f32[4,4]", True, False),
        ("f", "f32[8]", False, False),
    ]
    (est,) = [e for e in overlap.estimate(BESIDE) if e.name == "ars"]
    assert sum(float(r["us"]) for r in rows) == pytest.approx(est.compute_s * 1e6, abs=1e-3)
    # a fusion around a dynamic-update-slice is marked
    dus = BESIDE.replace(
        "ROOT %n = f32[8]{0} negate(%p)",
        "%z = s32[] constant(0)\n  %s = f32[1]{0} slice(%p), slice={[0:1]}\n"
        "  ROOT %n = f32[8]{0} dynamic-update-slice(%p, %s, %z)",
    )
    assert [r["dynamic update"] for r in lesson.window_rows(dus, "ars")] == [False, True]
