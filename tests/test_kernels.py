"""labkit.kernels: Pallas kernels in interpret mode, shared-memory arithmetic, HLO readers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from labkit import kernels
from labkit.xla import hlo

SCORES_HLO = """\
HloModule m, is_scheduled=true

ENTRY %main (p: bf16[2,4,8,8]) -> bf16[2,4,8,8] {
  %p = bf16[2,4,8,8]{3,2,1,0} parameter(0)
  %f = bf16[2,4,8,8]{3,2,1,0} fusion(%p), kind=kLoop, calls=%c
  ROOT %g = bf16[2,4,8,8]{3,2,1,0} custom-call(%f), custom_call_target="__cudnn$fmhaSoftmax"
}
"""


def test_matmul_is_bit_exact_against_the_same_summation_order() -> None:
    # the notebook's shapes; the CPU dot's inner order can depend on operand shapes
    x = jax.random.normal(jax.random.key(1), (256, 128), jnp.float32)
    y = jax.random.normal(jax.random.key(2), (128, 256), jnp.float32)
    got = kernels.matmul(x, y, block_k=32, interpret=True)
    assert (got == kernels.blocked_reference(x, y, block_k=32)).all()
    assert jnp.allclose(got, x @ y, atol=1e-4)


def test_matmul_rejects_blocks_that_do_not_divide() -> None:
    x = jnp.zeros((48, 64))
    with pytest.raises(ValueError, match="M=48 is not a multiple"):
        kernels.matmul(x, jnp.zeros((64, 64)), 32, 32, 16, interpret=True)


def test_softmax_within_a_few_ulp() -> None:
    s = jax.random.normal(jax.random.key(2), (32, 64), jnp.float32)
    got = kernels.softmax(s, block_rows=16, interpret=True)
    assert kernels.ulps(got, kernels.softmax_reference(s)) <= 8


def test_flash_attention_matches_f32_attention() -> None:
    q, k, v = (jax.random.normal(jax.random.key(i), (1, 64, 2, 16), jnp.bfloat16) for i in range(3))
    got = kernels.flash_attention(q, k, v, interpret=True).astype(jnp.float32)
    exact = kernels.plain_attention(*(a.astype(jnp.float32) for a in (q, k, v)))
    ref = jax.nn.dot_product_attention(q, k, v, is_causal=True).astype(jnp.float32)
    assert float(jnp.abs(got - exact).max()) < 2e-2
    assert float(jnp.abs(ref - exact).max()) < 2e-2


def test_smem_bytes_and_the_error_parser() -> None:
    assert kernels.matmul_smem_bytes(256, 256, 128) == 393216
    assert kernels.matmul_smem_bytes(128, 128, 64, itemsize=2, num_stages=3) == 98304
    msg = "RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested 393216, available"
    assert kernels.requested_smem(msg) == 393216 and kernels.requested_smem("other") is None


def test_ulps() -> None:
    one = jnp.ones(3, jnp.float32)
    assert kernels.ulps(one, one) == 0
    assert kernels.ulps(one + jnp.finfo(jnp.float32).eps, one) == 1


def test_hlo_readers() -> None:
    assert hlo.kernel_counts(SCORES_HLO) == {"kLoop": 1, "__cudnn$fmhaSoftmax": 1}
    assert kernels.score_buffers(SCORES_HLO, 2, 4, 8) == [("bf16", 1024), ("bf16", 1024)]
    assert kernels.score_buffers(SCORES_HLO, 2, 4, 16) == []


def test_cudnn_installed_is_a_version_or_none() -> None:
    found = kernels.cudnn_installed()
    assert found is None or found.startswith("9.")
