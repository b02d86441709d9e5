"""labkit.xla.cost: global FLOPs, and FLOPs counted from HLO shapes against XLA's cost analysis."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from labkit.core.mesh import abstract, make_mesh
from labkit.xla import cost

CUBLAS = """\
HloModule g, is_scheduled=true, num_partitions=4

ENTRY %main (a: bf16[2,64,32], b: bf16[2,32,16]) -> bf16[2,64,16] {
  %a = bf16[2,64,32]{2,1,0} parameter(0)
  %b = bf16[2,32,16]{2,1,0} parameter(1)
  %mm = (bf16[2,64,16]{2,1,0}, s8[4194304]{0}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["2"],"rhs_contracting_dimensions":["1"],"lhs_batch_dimensions":["0"],"rhs_batch_dimensions":["0"]}}}
  ROOT %r = bf16[2,64,16]{2,1,0} get-tuple-element(%mm), index=0
}
"""  # noqa: E501


def _mlp_grad(mesh: jax.sharding.Mesh) -> tuple[object, ...]:
    def loss(ws: list[jax.Array], x: jax.Array) -> jax.Array:
        for w in ws:
            x = jnp.tanh(x @ w)  # (batch, 256)
        return jnp.sum(x)

    ws = abstract([jax.ShapeDtypeStruct((256, 256), jnp.float32)] * 3, mesh)
    x = abstract(jax.ShapeDtypeStruct((64, 256), jnp.float32), mesh, P("data"))
    return jax.grad(loss), ws, x


def test_cublas_gemm_custom_call_counts_2mnk_per_batch() -> None:
    assert cost.hlo_flops(CUBLAS, per_device=True) == 2 * 2 * 64 * 16 * 32
    assert cost.hlo_flops(CUBLAS) == 4 * 2 * 2 * 64 * 16 * 32  # global: x num_partitions


def test_loops_count_their_trips() -> None:
    from test_overlap import PIPELINED  # a while loop with known_trip_count 3, 2 devices

    assert cost.hlo_flops(PIPELINED, per_device=True) == 3 * 2 * 64**3
    assert cost.hlo_flops(PIPELINED) == 2 * 3 * 2 * 64**3


def test_precision_of_operand_types() -> None:
    assert [cost.precision_of(s) for s in ("bf16[2]", "f32[2]", "f8e4m3fn[2]", "f64[1]")] == [
        "bf16",
        "tf32",
        "fp8",
        "fp32",
    ]


def test_sharded_flops_are_global_and_match_cost_analysis() -> None:
    mesh = make_mesh((8,), ("data",))
    a = abstract(jax.ShapeDtypeStruct((256, 128), jnp.float32), mesh, P("data"))
    b = abstract(jax.ShapeDtypeStruct((128, 64), jnp.float32), mesh)
    compiled = jax.jit(jnp.matmul).lower(a, b).compile()
    per_device = cost.cost(compiled)["flops"]  # XLA counts one device's share
    assert per_device == 2 * 32 * 128 * 64
    assert cost.hlo_flops(compiled.as_text(), per_device=True) == per_device
    assert cost.compiled_flops(compiled) == 8 * per_device == 2 * 256 * 128 * 64
    assert cost.flops(jnp.matmul, a, b) == 2 * 256 * 128 * 64
    assert cost.flops(jnp.matmul, a, b, per_device=True) == per_device


def test_hlo_count_of_a_train_step_is_close_to_cost_analysis() -> None:
    fn, ws, x = _mlp_grad(make_mesh((8,), ("data",)))
    compiled = jax.jit(fn).lower(ws, x).compile()
    counted, xla = cost.hlo_flops(compiled.as_text(), per_device=True), cost.cost(compiled)["flops"]
    assert counted == 8 * 256 * 256 * 8 * 2  # 3 forward, 3 weight-grad, 2 input-grad dots
    assert 0.9 * xla <= counted <= xla  # XLA also counts elementwise work (tanh, adds)


def test_convolution_counts_every_window_position() -> None:
    img, ker = jnp.ones((2, 8, 16, 16)), jnp.ones((4, 8, 3, 3))  # NCHW, OIHW
    compiled = jax.jit(lambda a, b: jax.lax.conv(a, b, (1, 1), "VALID")).lower(img, ker).compile()
    assert cost.hlo_flops(compiled.as_text()) == 2 * (2 * 4 * 14 * 14) * 8 * 9
    assert cost.hlo_flops(compiled.as_text()) == cost.cost(compiled)["flops"]


@pytest.mark.aot
def test_deviceless_flops_come_from_the_hlo() -> None:
    from labkit.xla import aot

    h100 = aot.h100_mesh((8,), ("data",))
    fn, ws, x = _mlp_grad(h100)
    result = aot.compile_for_gpu(fn, ws, x, compiler_options={"xla_gpu_enable_triton_gemm": False})
    assert cost.cost(result.compiled) == {}  # no cost analysis for compile-only GPUs
    cpu_fn, cpu_ws, cpu_x = _mlp_grad(make_mesh((8,), ("data",)))
    cpu = jax.jit(cpu_fn).lower(cpu_ws, cpu_x).compile()
    assert cost.compiled_flops(result.compiled) == cost.hlo_flops(cpu.as_text())  # same dots
    assert cost.compiled_flops(result.compiled, per_device=True) == 8 * 256 * 256 * 8 * 2
