"""A hand-written collective matmul in ``shard_map``: ring ``ppermute``, ``psum_scatter``, and
``all_to_all``, on a 1-D mesh named "x". ``labkit inspect tests/data/programs/shard_map_matmul.py``
"""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

MESH = {"x": 8}
M, K, N = 256, 512, 256


def _ring_matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """a: (M/n, K) rows, b: (K/n, N) rows -> (M/n, N) block of a @ b, b's blocks in a ring."""
    n = jax.lax.axis_size("x")
    me = jax.lax.axis_index("x")
    kb = b.shape[0]
    perm = [(j, (j - 1) % n) for j in range(n)]

    def body(i: int, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        acc, blk = carry
        k0 = ((me + i) % n) * kb
        acc = acc + jax.lax.dynamic_slice_in_dim(a, k0, kb, axis=1) @ blk
        return acc, jax.lax.ppermute(blk, "x", perm)

    acc = jnp.zeros((a.shape[0], b.shape[1]), jnp.float32)
    acc, _ = jax.lax.fori_loop(0, n, body, (acc, b))
    out = jax.lax.psum_scatter(acc, "x", scatter_dimension=1, tiled=True)  # (M/n, N/n)
    return jax.lax.all_to_all(out, "x", 0, 1, tiled=True)  # (M/n/n, N)


@jax.jit
def step(a: jax.Array, b: jax.Array) -> jax.Array:
    """The collective matmul over the context mesh (inspect sets it)."""
    return jax.shard_map(
        _ring_matmul,
        in_specs=(P("x", None), P("x", None)),
        out_specs=P("x", None),
        check_vma=False,
    )(a, b)


def example_args() -> tuple:
    """bf16 operands, rows split over "x"."""
    sds = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.bfloat16, sharding=P("x", None))
    return sds((M, K)), sds((K, N))
