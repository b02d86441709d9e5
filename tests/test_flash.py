"""labkit.kernels.flash: flash kernels skip masked blocks, match attention, have a backward."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from labkit.kernels import flash
from labkit.kernels.pallas import compile_kernel_for_h100
from labkit.xla import hlo

SHAPE = (1, 128, 1, 64)  # 2 blocks of 64: the causal forward reads 1 + 2 key blocks of 4


def _qkv() -> tuple[jax.Array, ...]:
    keys = jax.random.split(jax.random.key(0), 3)
    return tuple(jax.random.normal(k, SHAPE, jnp.bfloat16) for k in keys)


def test_forward_matches_attention_and_visits_only_unmasked_blocks() -> None:
    q, k, v = _qkv()
    o, lse, visits = flash.forward(q, k, v, interpret=True)
    assert float(jnp.abs(o.astype(jnp.float32) - flash.reference(q, k, v)).max()) < 2e-2
    per_block = np.asarray(visits[0, 0, :: flash.BLOCK]).tolist()
    assert per_block == flash.kv_blocks_visited(128) == [1, 2]
    assert flash.kv_blocks_visited(128, causal=False) == [2, 2]
    assert lse.shape == (1, 1, 128) and bool(jnp.isfinite(lse).all())


def test_backward_matches_jax_grad_of_the_reference() -> None:
    errors = flash.gradient_errors(*_qkv())
    assert set(errors) == {"dq", "dk", "dv"} and max(errors.values()) < 1e-2


def test_forward_and_backward_compile_for_an_h100() -> None:
    q = jax.ShapeDtypeStruct((1, 256, 2, 64), jnp.bfloat16)
    fwd = compile_kernel_for_h100(lambda a, b, c: flash.forward(a, b, c)[0], q, q, q)
    assert hlo.kernel_counts(fwd.hlo) == {"mosaic_gpu_v2": 1}

    def grads(a: jax.Array, b: jax.Array, c: jax.Array) -> tuple[jax.Array, ...]:
        return jax.grad(lambda *x: flash.flash_attention(*x).astype(jnp.float32).sum(), (0, 1, 2))(
            a, b, c
        )

    both = compile_kernel_for_h100(grads, q, q, q)
    assert hlo.kernel_counts(both.hlo).get("mosaic_gpu_v2") == 3  # forward, dq, dk and dv


@pytest.mark.parametrize(
    ("shape", "dtype", "match"),
    [((1, 96, 1, 64), jnp.bfloat16, "multiple of 64"), ((1, 64, 1, 64), jnp.float32, "bfloat16")],
)
def test_shapes_the_kernels_cannot_take(shape: tuple[int, ...], dtype: object, match: str) -> None:
    x = jnp.zeros(shape, dtype)
    with pytest.raises(ValueError, match=match):
        flash.forward(x, x, x, interpret=True)
