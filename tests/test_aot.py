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
