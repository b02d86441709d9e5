"""FP8 and int8 matmuls and a top-k, on one H100: library calls and narrow types in HLO.

The FP8 product dequantizes straight to bf16 (``q.astype(bf16) * scale``), the pattern XLA
rewrites into one scaled FP8 cuBLASLt call; the int8 product accumulates in int32.
``labkit inspect tests/data/programs/low_precision.py --mesh data=1``
"""

import jax
import jax.numpy as jnp

MESH = "data=1"


def step(
    x8: jax.Array, w8: jax.Array, sx: jax.Array, sw: jax.Array, xi: jax.Array, wi: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(FP8 product in bf16, int8 product in int32, top 4 values of each FP8 product row)."""
    y = (x8.astype(jnp.bfloat16) * sx) @ (w8.astype(jnp.bfloat16) * sw)  # (m, n) bf16
    z = jax.lax.dot(xi, wi, preferred_element_type=jnp.int32)  # (m, n) int32
    top, _ = jax.lax.top_k(y.astype(jnp.float32), 4)
    return y, z, top


def example_args() -> tuple:
    """e4m3 operands with bf16 scales, int8 operands; replicated."""
    sds = jax.ShapeDtypeStruct
    m, k, n = 128, 256, 128
    return (
        sds((m, k), jnp.float8_e4m3fn),
        sds((k, n), jnp.float8_e4m3fn),
        sds((), jnp.bfloat16),
        sds((), jnp.bfloat16),
        sds((m, k), jnp.int8),
        sds((k, n), jnp.int8),
    )
