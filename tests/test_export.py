"""labkit.export: save/load round trip, clear errors, fresh process, describe, IREE."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from labkit import export as ex


def f(params: dict, x: jax.Array) -> jax.Array:
    """A tiny model: (b, t, 4) -> (b,)."""
    return jnp.tanh(x @ params["0"]["w"]).sum(axis=(1, 2)) + params["0"]["b"].sum()


PARAMS = {"0": {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3),
                "b": np.ones(3, np.float32)}}  # fmt: skip


def _symbolic() -> jax.export.Exported:
    b, t = jax.export.symbolic_shape("b, t", constraints=("t <= 4",))
    return ex.export(f, PARAMS, jax.ShapeDtypeStruct((b, t, 4), jnp.float32))


def _x(batch: int = 2, t: int = 4) -> np.ndarray:
    return np.arange(batch * t * 4, dtype=np.float32).reshape(batch, t, 4) / 10  # (b, t, 4)


def test_keys_round_trip() -> None:
    tree = {0: {"w": 1}, "a": {1: 2}}
    assert ex.string_keys(tree) == {"0": {"w": 1}, "a": {"1": 2}}
    assert ex.int_keys(ex.string_keys(tree)) == tree


def test_save_load_call_and_describe(tmp_path: Path) -> None:
    exp = _symbolic()
    path = ex.save(exp, tmp_path / "f.jaxexport", vjp_order=1)
    art = ex.load(path)
    assert art.meta["bounds"] == {"b": [1, float("inf")], "t": [1, 4]}
    np.testing.assert_allclose(ex.call(art, PARAMS, _x()), f(PARAMS, _x()), rtol=1e-6)
    info = ex.describe(art)
    assert info.platforms == ("cpu",) and info.has_vjp and info.symbols["t"] == (1, 4)
    assert "float32[b,t,4]" in info.inputs and info.outputs == ["float32[b]"]
    assert info.calling_convention_version == exp.calling_convention_version
    assert info.ops["stablehlo.dot_general"] == 1
    assert {r["field"] for r in info.rows()} >= {"platforms", "symbols", "calling convention"}


@pytest.mark.parametrize("damage", ["truncate", "flip", "foreign", "missing"])
def test_damaged_artifacts_raise_clear_errors(tmp_path: Path, damage: str) -> None:
    path = ex.save(_symbolic(), tmp_path / "f.jaxexport")
    blob = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(blob[:-3])
        match = "truncated"
    elif damage == "flip":
        path.write_bytes(blob[:-10] + bytes([blob[-10] ^ 0xFF]) + blob[-9:])
        match = "corrupted"
    elif damage == "foreign":
        path.write_bytes(blob[len(ex.MAGIC) :])
        match = "not a labkit export artifact"
    else:
        path = tmp_path / "nothing.jaxexport"
        match = "no artifact"
    with pytest.raises(ex.ArtifactError, match=match):
        ex.load(path)


def test_wrong_platform_is_explained() -> None:
    exp = ex.export(f, PARAMS, _x(), platforms=("cuda",))
    with pytest.raises(ex.PlatformMismatch, match=r"exported for \('cuda',\).*re-export"):
        ex.call(exp, PARAMS, _x())
    both = ex.export(f, PARAMS, _x(), platforms=("cuda", "cpu"))
    assert ex.check_platform(both) == "cpu"


def test_wrong_inputs_are_explained() -> None:
    exp = _symbolic()
    with pytest.raises(ex.InputShapeError, match=r"t = 5 is outside .* t <= 4"):
        ex.call(exp, PARAMS, _x(2, 5))
    with pytest.raises(ex.InputShapeError, match="must be 4"):
        ex.call(ex.export(f, PARAMS, _x()), PARAMS, _x(2, 3))
    with pytest.raises(ex.InputShapeError, match="pass a float32 array of rank 3"):
        ex.call(exp, PARAMS, _x().astype(np.int32))
    with pytest.raises(ex.InputShapeError, match="structured as"):
        ex.call(exp, {"w": PARAMS["0"]["w"]}, _x())
    assert ex.check_inputs(exp, PARAMS, _x(3)) == {"b": 3, "t": 4}
    assert ex.check_inputs(exp, PARAMS, _x(1, 2)) == {"b": 1, "t": 2}


def test_run_in_fresh_process(tmp_path: Path) -> None:
    path = ex.save(_symbolic(), tmp_path / "f.jaxexport")
    run = ex.run_in_fresh_process(path, PARAMS, _x(3))
    assert run.imported == [] and run.backend == "cpu"
    np.testing.assert_allclose(run.outputs[0], f(PARAMS, _x(3)), rtol=1e-6)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ex.ArtifactError, match="truncated"):
        ex.run_in_fresh_process(path, PARAMS, _x(3))


SHARDED = """module @jit_f attributes {mhlo.num_partitions = 1 : i32} {
  sdy.mesh @mesh = <["d"=1]>
  func.func public @main(%arg0: tensor<4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"d"}]>}) -> (tensor<4xf32> {jax.result_info = "result", sdy.sharding = #sdy.sharding<@mesh, [{}]>}) {
    %0 = stablehlo.add %arg0, %arg0 : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""  # noqa: E501


def test_strip_sharding() -> None:
    text = ex.strip_sharding(SHARDED)
    assert "sdy" not in text and '{jax.result_info = "result"}' in text
    assert "%arg0: tensor<4xf32>)" in text
    with pytest.raises(ValueError, match="export the function without"):
        ex.strip_sharding(SHARDED.replace("stablehlo.add %arg0", "sdy.sharding_constraint %arg0"))


def test_iree_missing_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "iree_available", lambda: False)
    with pytest.raises(ex.IreeUnavailable, match="pip install iree-base-compiler"):
        ex.iree_compile("module {}")


@pytest.mark.skipif(not ex.iree_available(), reason="IREE not installed: "
                    "pip install iree-base-compiler iree-base-runtime")  # fmt: skip
def test_iree_compiles_and_runs_the_export() -> None:
    exp = ex.export(f, PARAMS, _x(), platforms=("cpu",))
    vmfb = ex.iree_compile(exp.mlir_module())
    (out,) = ex.iree_run(vmfb, *ex.iree_inputs(exp, PARAMS, _x()))
    np.testing.assert_allclose(out, f(PARAMS, _x()), rtol=1e-5)
    stripped = ex.iree_compile(ex.strip_sharding(SHARDED))
    assert ex.iree_run(stripped, np.ones(4, np.float32))[0].tolist() == [2.0] * 4


@pytest.mark.skipif(not ex.iree_available(), reason="IREE not installed")
def test_iree_errors_are_explained() -> None:
    with pytest.raises(ex.IreeCompileError, match=r"Dialect `sdy' not found.*strip_sharding"):
        ex.iree_compile(SHARDED)
