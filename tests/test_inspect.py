"""labkit.xla.inspect: any function compiled for H100s without a GPU, and the file convention.

Real deviceless compiles: a tiny sharded matmul, and three programs the kit did not write
(tests/data/programs: a scan-over-layers model, a remat'd model, a shard_map program), whose
reports must match the saved fixtures (tests/data/hlo) that test_inspect_report.py reads.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from labkit.core.mesh import make_mesh
from labkit.gpt.compile import same_program_options
from labkit.xla import inspect as inspection
from labkit.xla.inspect_report import build_report
from labkit.xla.inspect_schema import SCHEMA

DATA = Path(__file__).resolve().parent / "data"


def matmul_sum(x: jax.Array, w: jax.Array, scale: float = 1.0) -> jax.Array:
    """A tiny program whose batch split needs one all-reduce: sum(tanh(x @ w)) * scale."""
    return jnp.tanh(x @ w).sum() * scale


def test_mesh_axes_forms() -> None:
    assert inspection.mesh_axes("data=4, model=2") == {"data": 4, "model": 2}
    assert inspection.mesh_axes({"x": 8}) == {"x": 8}
    assert inspection.mesh_axes(AbstractMesh((2, 4), ("a", "b"))) == {"a": 2, "b": 4}
    for bad in ("data:4", "", "data=0", {"x": "8"}, 8):
        with pytest.raises(ValueError, match="mesh"):
            inspection.mesh_axes(bad)


def test_split_spec() -> None:
    assert inspection.split_spec("a/model.py:train_step") == (Path("a/model.py"), "train_step")
    assert inspection.split_spec("model.py") == (Path("model.py"), inspection.DEFAULT_NAME)
    with pytest.raises(inspection.ProgramFileError, match=r"FILE\.py"):
        inspection.split_spec("model.txt")


def test_target_mesh_and_place() -> None:
    h100 = inspection.target_mesh(None, num_gpus=4)
    assert inspection.mesh_axes(h100) == {"data": 4}
    assert all("H100" in d.device_kind for d in h100.devices.flat)
    cpu = make_mesh((4, 2), ("data", "model"))  # this process's 8 CPU devices
    x = jax.device_put(np.ones((8, 4), np.float32), NamedSharding(cpu, P("data", "model")))
    mesh = inspection.target_mesh(None, (x,))
    assert inspection.mesh_axes(mesh) == {"data": 4, "model": 2}
    explicit = make_mesh((8,), ("data",), explicit=True)
    assert inspection.target_mesh(explicit).axis_types == (AxisType.Explicit,)
    # An AbstractMesh has no devices (reading them raises ValueError): its axes are used.
    abstract = AbstractMesh((2, 4), ("data", "model"))
    assert inspection.mesh_axes(inspection.target_mesh(abstract)) == {"data": 2, "model": 4}
    on_abstract = jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=NamedSharding(abstract, P()))
    assert inspection.mesh_axes(inspection.target_mesh(None, (on_abstract,))) == {
        "data": 2,
        "model": 4,
    }
    bare = jax.ShapeDtypeStruct((8, 4), jnp.bfloat16, sharding=P(None, "model"))
    placed = inspection.place({"x": x, "bare": bare, "host": np.zeros(3), "lr": 0.1}, mesh)
    assert placed["x"].sharding == NamedSharding(mesh, P("data", "model"))
    assert placed["bare"].sharding == NamedSharding(mesh, P(None, "model"))
    assert placed["host"].sharding == NamedSharding(mesh, P())  # no sharding: replicated
    assert placed["lr"] == 0.1
    with pytest.raises(ValueError, match=r"model.*pass a mesh with that axis"):
        inspection.place(bare, inspection.target_mesh("data=8"))


@pytest.fixture(scope="module")
def tiny() -> inspection.Report:
    x = jax.ShapeDtypeStruct((64, 128), jnp.bfloat16, sharding=P("data"))
    w = jax.ShapeDtypeStruct((128, 128), jnp.bfloat16)
    return inspection.inspect(
        matmul_sum,
        x,
        w,
        compiler_options={"xla_gpu_all_reduce_combine_threshold_bytes": 0},
        same_program_options=same_program_options(),
        scale=jnp.float32(2.0),  # a keyword argument, traced (not a constant)
    )


def test_inspect_a_function(tiny: inspection.Report) -> None:
    assert tiny.program.name == "matmul_sum" and tiny.program.mesh == {"data": 8}
    assert tiny.program.jax_version == jax.__version__
    # the flags given are listed; the same-program options are not
    assert tiny.program.compiler_options == {"xla_gpu_all_reduce_combine_threshold_bytes": 0}
    assert tiny.collective_counts() == {"all-reduce": 1}  # the batch-split sum
    assert tiny.flops.per_device == 2 * 8 * 128 * 128  # (8, 128) @ (128, 128) per device
    assert tiny.memory is not None and tiny.memory.argument == 8 * 128 * 2 + 128 * 128 * 2 + 4
    jsonschema.validate(json.loads(tiny.to_json()), SCHEMA)


def test_inspect_errors() -> None:
    x = jax.ShapeDtypeStruct((64, 128), jnp.bfloat16, sharding=P("data"))
    with pytest.raises(ValueError, match="unknown target"):
        inspection.inspect(matmul_sum, x, x, target="tpu")
    with pytest.raises(ValueError, match="at least one array"):
        inspection.inspect(lambda s: s, 1.0)
    with pytest.raises(inspection.CompileError, match="No such compile option") as err:
        w = jax.ShapeDtypeStruct((128, 8), jnp.bfloat16)
        inspection.inspect(matmul_sum, x, w, compiler_options={"xla_no": 1})
    assert "labkit flags check" in str(err.value)


def test_file_convention_errors(tmp_path: Path) -> None:
    with pytest.raises(inspection.ProgramFileError, match="no such file"):
        inspection.inspect_file(tmp_path / "missing.py")
    (tmp_path / "m.py").write_text("def step(x):\n    return x\n\n\ndef helper():\n    pass\n")
    with pytest.raises(inspection.ProgramFileError, match=r"no function 'train'.*helper, step"):
        inspection.inspect_file(f"{tmp_path / 'm.py'}:train")
    with pytest.raises(inspection.ProgramFileError, match="def example_args"):
        inspection.inspect_file(tmp_path / "m.py")
    (tmp_path / "n.py").write_text(
        "def step(x):\n    return x\n\n\ndef example_args():\n    return 1\n"
    )
    with pytest.raises(inspection.ProgramFileError, match="return a tuple"):
        inspection.inspect_file(tmp_path / "n.py")
    (tmp_path / "broken.py").write_text("import no_such_module_here\n")
    with pytest.raises(ModuleNotFoundError):  # the file's own error, unchanged
        inspection.load_program(tmp_path / "broken.py")


def test_load_program_keeps_function_identity(tmp_path: Path) -> None:
    path = tmp_path / "p.py"
    path.write_text("def step(x):\n    return x\n")
    first = inspection.load_program(path).step
    assert inspection.load_program(path).step is first  # same file: same function, cached
    path.write_text("def step(x):\n    return x + 1\n\n")
    assert inspection.load_program(path).step is not first  # edited: imported again


@functools.cache
def program(spec: str) -> inspection.Report:
    return inspection.inspect_file(
        DATA / "programs" / spec, same_program_options=same_program_options()
    )


@pytest.mark.parametrize(
    ("spec", "fixture"),
    [
        ("scan_mlp.py", "scan_mlp"),
        ("remat_mlp.py:train_step", "remat_mlp"),
        ("shard_map_matmul.py", "shard_map_matmul"),
    ],
)
def test_programs_the_kit_did_not_write(spec: str, fixture: str) -> None:
    report = program(spec)
    assert report.program.name.startswith(Path(spec.split(":")[0]).name + ":")
    saved = build_report((DATA / "hlo" / f"{fixture}.hlo").read_text(), name=report.program.name)
    # the saved fixture is this jaxlib's program: regenerate with tests/data/make_hlo_fixtures.py
    # the saved text has no compiled object (memory) and no schedule dump (XLA's estimate)
    summary = {k: v for k, v in report.summary().items() if not k.startswith(("memory", "XLA"))}
    assert summary == saved.summary()
    assert report.xla_estimate is not None
    assert report.summary()["XLA's model step us"] == report.xla_estimate.step_us
    if fixture == "scan_mlp":  # async dynamic-slice fusions in the loops: XLA's 5000 constant
        assert any("5000" in f["why"] for f in report.xla_estimate.flagged)
    assert report.memory is not None and report.memory.total > 0
    jsonschema.validate(json.loads(report.to_json()), SCHEMA)
