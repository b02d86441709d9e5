"""An MLP-Mixer (Tolstikhin et al., 2021) in Flax NNX and its training step: a model the kit
did not write, in the file convention of ``labkit inspect`` (notebook 10 reads it).

The only addition to a plain model: each kernel names its axes (``nnx.with_partitioning``),
``"embed"`` for channels and ``"mlp"`` for hidden units, so that sharding rules
(``labkit.parallel.sharding``) can map them to mesh axes per strategy. Without a mesh (eager
sharding off) the names are only metadata. From the kit's folder:

    .venv/bin/labkit inspect notebooks/models/mlp_mixer.py:train_step
"""

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import PartitionSpec as P

MESH = "data=8"


def dense(d_in: int, d_out: int, names: tuple, rngs: nnx.Rngs) -> nnx.Linear:
    """A bias-free Linear computing in bf16, its kernel's axes named for the sharding rules."""
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), names)
    return nnx.Linear(d_in, d_out, use_bias=False, dtype=jnp.bfloat16, kernel_init=init, rngs=rngs)


class MixerBlock(nnx.Module):
    """Token mixing across patches, then channel mixing: two MLPs with residuals."""

    def __init__(self, patches: int, dim: int, rngs: nnx.Rngs) -> None:
        self.norm1 = nnx.LayerNorm(dim, use_bias=False, use_scale=False, rngs=rngs)
        self.tokens_in = dense(patches, 2 * patches, (None, "mlp"), rngs)
        self.tokens_out = dense(2 * patches, patches, ("mlp", None), rngs)
        self.norm2 = nnx.LayerNorm(dim, use_bias=False, use_scale=False, rngs=rngs)
        self.channels_in = dense(dim, 4 * dim, ("embed", "mlp"), rngs)
        self.channels_out = dense(4 * dim, dim, ("mlp", "embed"), rngs)

    def __call__(self, x: jax.Array) -> jax.Array:  # (batch, patches, dim)
        y = self.norm1(x).swapaxes(1, 2)  # (batch, dim, patches)
        x = x + self.tokens_out(jax.nn.gelu(self.tokens_in(y))).swapaxes(1, 2)
        return x + self.channels_out(jax.nn.gelu(self.channels_in(self.norm2(x))))


class Mixer(nnx.Module):
    """MLP-Mixer: (batch, image, image, 3) images -> (batch, classes) logits."""

    def __init__(
        self,
        rngs: nnx.Rngs,
        image: int = 32,
        patch: int = 4,
        dim: int = 128,
        depth: int = 1,
        classes: int = 10,
    ) -> None:
        self.patch, patches = patch, (image // patch) ** 2
        self.embed = dense(patch * patch * 3, dim, (None, "embed"), rngs)
        self.blocks = nnx.List([MixerBlock(patches, dim, rngs) for _ in range(depth)])
        self.norm = nnx.LayerNorm(dim, use_bias=False, use_scale=False, rngs=rngs)
        self.head = dense(dim, classes, ("embed", None), rngs)

    def __call__(self, images: jax.Array) -> jax.Array:  # (batch, height, width, 3)
        b, h, w, c = images.shape
        p = self.patch
        x = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
        x = self.embed(x.reshape(b, (h // p) * (w // p), p * p * c))  # (batch, patches, dim)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(axis=1))  # (batch, classes)


def loss_fn(model: Mixer, images: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean cross entropy of integer ``labels``."""
    logits = model(images).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


@functools.partial(jax.jit, donate_argnums=(0, 1))  # new model and optimizer overwrite the old
def train_step(model: Mixer, optimizer: nnx.Optimizer, images: jax.Array, labels: jax.Array):
    """One AdamW step: the updated model and optimizer, and the loss."""
    loss, grads = nnx.value_and_grad(loss_fn)(model, images, labels)
    optimizer.update(model, grads)
    return model, optimizer, loss


def abstract_model(**sizes: int) -> tuple[Mixer, nnx.Optimizer]:
    """The model and its AdamW optimizer as shapes only (``nnx.eval_shape``): nothing allocated."""
    with nnx.use_eager_sharding(False):  # the axis names wait for a mesh
        model = nnx.eval_shape(lambda: Mixer(nnx.Rngs(0), **sizes))
        tx = optax.adamw(1e-3)
        optimizer = nnx.eval_shape(
            lambda: nnx.Optimizer(Mixer(nnx.Rngs(0), **sizes), tx, wrt=nnx.Param)
        )
    return model, optimizer


def train_step_args(mesh: jax.sharding.Mesh) -> tuple:
    """Data parallel: model and optimizer replicated, 64 images split over "data"."""
    del mesh  # the PartitionSpecs name its axes
    model, optimizer = abstract_model()
    images = jax.ShapeDtypeStruct((64, 32, 32, 3), jnp.bfloat16, sharding=P("data"))
    labels = jax.ShapeDtypeStruct((64,), jnp.int32, sharding=P("data"))
    return model, optimizer, images, labels
