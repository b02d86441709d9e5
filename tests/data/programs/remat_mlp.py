"""A rematerialised (``jax.checkpoint``) residual MLP train step, data parallel.

Each block saves nothing for the backward pass (``nothing_saveable``): XLA recomputes its
activations there. ``labkit inspect tests/data/programs/remat_mlp.py:train_step``
"""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

BLOCKS, WIDTH, HIDDEN, BATCH = 3, 128, 512, 64


@jax.checkpoint  # recompute this block in the backward pass instead of keeping its activations
def block(h: jax.Array, w_in: jax.Array, w_out: jax.Array) -> jax.Array:
    """A residual MLP block: (batch, width) -> (batch, width)."""
    return h + jax.nn.gelu(h @ w_in) @ w_out


def loss(params: list[tuple[jax.Array, jax.Array]], x: jax.Array) -> jax.Array:
    """A made-up objective: the mean square of the output."""
    h = x
    for w_in, w_out in params:
        h = block(h, w_in, w_out)
    return jnp.mean(h.astype(jnp.float32) ** 2)


def train_step(params: list[tuple[jax.Array, jax.Array]], x: jax.Array) -> tuple:
    """One SGD step; the batch is split over "data", the params replicated."""
    value, grads = jax.value_and_grad(loss)(params, x)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), value


def train_step_args() -> tuple:
    """Replicated bf16 params, a bf16 batch split over "data"."""
    sds = jax.ShapeDtypeStruct
    params = [
        (sds((WIDTH, HIDDEN), jnp.bfloat16), sds((HIDDEN, WIDTH), jnp.bfloat16))
        for _ in range(BLOCKS)
    ]
    return params, sds((BATCH, WIDTH), jnp.bfloat16, sharding=P("data"))
