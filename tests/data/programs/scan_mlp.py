"""A scan-over-layers MLP train step with FSDP: a program the kit did not write.

The layers' weights are stacked on a leading axis and run by ``jax.lax.scan`` (a ``while``
loop in HLO); each weight is sharded over ``"data"`` (FSDP), so XLA gathers one layer's
weights inside the loop. ``labkit inspect tests/data/programs/scan_mlp.py``
"""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

MESH = "data=8"
LAYERS, WIDTH, BATCH, CLASSES = 4, 256, 64, 16


def forward(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """(batch, width) -> (batch, classes) logits through LAYERS scanned relu layers."""

    def layer(h: jax.Array, w: jax.Array) -> tuple[jax.Array, None]:
        return jax.nn.relu(h @ w), None  # (batch, width)

    h, _ = jax.lax.scan(layer, x, params["layers"])
    return h @ params["head"]


def loss(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean squared error against one-hot-like targets ``y``."""
    return jnp.mean((forward(params, x).astype(jnp.float32) - y) ** 2)


@functools.partial(jax.jit, donate_argnums=0)
def step(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> tuple[dict, jax.Array]:
    """One SGD step: new params and the loss."""
    value, grads = jax.value_and_grad(loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), value


def example_args(mesh: jax.sharding.Mesh) -> tuple:
    """Params sharded FSDP-style over "data", a batch split over "data"."""
    del mesh  # PartitionSpecs name the axes; inspect places them on the mesh
    sds = jax.ShapeDtypeStruct
    params = {
        "layers": sds((LAYERS, WIDTH, WIDTH), jnp.bfloat16, sharding=P(None, "data")),
        "head": sds((WIDTH, CLASSES), jnp.bfloat16, sharding=P("data")),
    }
    x = sds((BATCH, WIDTH), jnp.bfloat16, sharding=P("data"))
    y = sds((BATCH, CLASSES), jnp.float32, sharding=P("data"))
    return params, x, y
