"""Your model, in the file convention of ``labkit inspect`` (notebook 10 inspects this file).

Replace the model, the loss and the step with yours; keep the two names ``step`` and
``example_args`` (or name the function on the command line: ``your_model.py:NAME``, and its
arguments ``NAME_args``). From the kit's folder:

    .venv/bin/labkit inspect notebooks/models/your_model.py
    .venv/bin/labkit inspect notebooks/models/your_model.py --mesh data=4 --json

The example: a two-layer MLP classifier in Flax NNX, trained with AdamW, data parallel.
"""

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import PartitionSpec as P

MESH = "data=8"  # the mesh used when none is given (--mesh, or the notebook's MESH)
BATCH, FEATURES, HIDDEN, CLASSES = 256, 784, 1024, 10


class MLP(nnx.Module):
    """(batch, features) -> (batch, classes) logits."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(FEATURES, HIDDEN, dtype=jnp.bfloat16, rngs=rngs)
        self.out = nnx.Linear(HIDDEN, CLASSES, dtype=jnp.bfloat16, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(jax.nn.relu(self.hidden(x)))


def loss_fn(model: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean cross entropy of integer labels ``y``."""
    logits = model(x).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


@functools.partial(jax.jit, donate_argnums=(0, 1))  # new params overwrite the old ones
def step(model: MLP, optimizer: nnx.Optimizer, x: jax.Array, y: jax.Array) -> tuple:
    """One AdamW step: the updated model and optimizer, and the loss."""
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
    optimizer.update(model, grads)
    return model, optimizer, loss


def example_args(mesh: jax.sharding.Mesh) -> tuple:
    """Abstract model and optimizer (nothing allocated), replicated; a batch split over "data".

    ``mesh`` is the H100 mesh the step compiles for: use its axis names in your
    PartitionSpecs (an array without one is replicated).
    """
    del mesh  # this example shards only the batch, over "data"
    model = nnx.eval_shape(lambda: MLP(nnx.Rngs(0)))
    optimizer = nnx.eval_shape(
        lambda: nnx.Optimizer(MLP(nnx.Rngs(0)), optax.adamw(1e-3), wrt=nnx.Param)
    )
    x = jax.ShapeDtypeStruct((BATCH, FEATURES), jnp.float32, sharding=P("data"))
    y = jax.ShapeDtypeStruct((BATCH,), jnp.int32, sharding=P("data"))
    return model, optimizer, x, y
