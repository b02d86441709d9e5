"""labkit.xla.aot: the H100 target spec compiles real XLA:GPU programs on a CPU machine."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from labkit.xla import aot as gpu_aot


def _mlp_grad(ws: list[jax.Array], x: jax.Array) -> list[jax.Array]:
    def loss(ws: list[jax.Array], x: jax.Array) -> jax.Array:
        for w in ws:
            x = jnp.tanh(x @ w)  # (batch, width)
        return jnp.sum(x)

    return jax.grad(loss)(ws, x)


def _inputs(mesh: jax.sharding.Mesh, width: int = 512) -> tuple[object, object]:
    ws = gpu_aot.abstract([jnp.zeros((width, width), jnp.bfloat16)] * 2, mesh)
    x = gpu_aot.abstract(jnp.zeros((64, width), jnp.bfloat16), mesh, P("data"))
    return ws, x


def test_target_spec_gives_h100_devices() -> None:
    topo = gpu_aot.h100_topology(8)
    assert len(topo.devices) == 8
    assert topo.devices[0].device_kind == "NVIDIA H100 80GB HBM3"
    assert len(gpu_aot.h100_topology(4, num_hosts=2).devices) == 8


def test_data_parallel_compile_is_real_gpu_hlo() -> None:
    mesh = gpu_aot.h100_mesh((8,), ("data",))
    result = gpu_aot.compile_for_gpu(_mlp_grad, *_inputs(mesh))
    assert result.num_devices == 8
    assert "is_scheduled=true" in result.hlo
    assert "all-reduce" in result.hlo  # gradients of replicated weights are summed
    assert "__triton" in result.hlo or "__cublas" in result.hlo  # GPU GEMM, not a CPU dot


def test_compiler_options_change_the_program() -> None:
    mesh = gpu_aot.h100_mesh((8,), ("data",))
    cublas = gpu_aot.compile_for_gpu(
        _mlp_grad, *_inputs(mesh), compiler_options={"xla_gpu_enable_triton_gemm": False}
    )
    assert "__cublas$lt$matmul" in cublas.hlo or "__cublas$gemm" in cublas.hlo


def test_unknown_compiler_option_raises_instead_of_killing() -> None:
    mesh = gpu_aot.h100_mesh((8,), ("data",))
    with pytest.raises(Exception, match="xla_gpu_no_such_flag"):
        gpu_aot.compile_for_gpu(
            _mlp_grad, *_inputs(mesh), compiler_options={"xla_gpu_no_such_flag": True}
        )


def test_two_hosts_mesh() -> None:
    mesh = gpu_aot.h100_mesh((2, 8), ("host", "data"), num_hosts=2)
    assert {d.process_index for d in mesh.devices.flat} == {0, 1}


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (((32,), ("data",)), "num_gpus must be 1..16"),
        (((8,), ("data", "model")), "differ in length"),
        (((6,), ("data",), 4), "not divisible by 4 hosts"),
    ],
)
def test_bad_meshes(args: tuple[object, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        gpu_aot.h100_mesh(*args)  # type: ignore[arg-type]


def test_cpu_inputs_are_refused() -> None:
    mesh = jax.make_mesh((8,), ("data",))
    x = gpu_aot.abstract(jnp.zeros((8, 8)), mesh, P("data"))
    with pytest.raises(ValueError, match="H100 mesh"):
        gpu_aot.compile_for_gpu(jnp.sin, x)


def test_b200_target_is_compute_capability_10_from_the_table() -> None:
    config = gpu_aot.target_config("B200")
    assert "major: 10 minor: 0" in config and "core_count: 148" in config
    assert 'device_description_str: "NVIDIA B200"' in config
    assert "l2_cache_size: 132644864" in config  # 126.5 MiB, as XLA's b200 spec file
    assert gpu_aot.B200_TARGET == config
    assert "major: 9 minor: 0" in gpu_aot.H100_SXM_TARGET  # the H100 target is unchanged


@pytest.mark.parametrize(
    ("gpu", "match"), [("A100 SXM", "A100 SXM is not one"), ("H100 NVL", "no SM count")]
)
def test_targets_without_a_spec_are_refused(gpu: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        gpu_aot.target_config(gpu)


def test_b200_mesh_compiles_for_sm_100() -> None:
    mesh = gpu_aot.b200_mesh((2,), ("data",))
    assert {d.device_kind for d in mesh.devices.flat} == {"NVIDIA B200"}
    assert gpu_aot.gpu_mesh((2,), ("data",), target="B200").devices.shape == (2,)
    result = gpu_aot.compile_for_gpu(_mlp_grad, *_inputs(mesh, width=256))
    assert result.num_devices == 2 and "all-reduce" in result.hlo
    h100 = gpu_aot.gpu_mesh((2,), ("data",))  # default target: H100
    assert {d.device_kind for d in h100.devices.flat} == {"NVIDIA H100 80GB HBM3"}


def test_one_compile_takes_one_kind_of_gpu() -> None:
    x = gpu_aot.abstract(jnp.zeros((8, 8)), gpu_aot.h100_mesh((1,), ("x",)))
    y = gpu_aot.abstract(jnp.zeros((8, 8)), gpu_aot.b200_mesh((1,), ("x",)))
    with pytest.raises(ValueError, match="one compile-only GPU mesh"):
        gpu_aot.compile_for_gpu(jnp.add, x, y)
