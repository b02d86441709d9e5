"""Attention as JAX writes it, as cuDNN fuses it, and what each leaves in HBM.

- :func:`plain_attention`: causal attention written out, the full (batch, heads, seq, seq)
  score matrix in between (XLA fuses around it);
- :func:`cudnn_attention`: ``jax.nn.dot_product_attention(..., implementation="cudnn")``, one
  cuDNN fused kernel (``__cudnn$fmha...``); building it needs cuDNN's library, even for a
  compile-only GPU (:func:`cudnn_installed`). ``implementation=None`` is XLA's, not cuDNN's;
- the kit's own flash kernels are in :mod:`labkit.kernels.flash`;
- :func:`with_grad`, :func:`score_buffers`: a forward-and-backward program, and the
  score-matrix-sized buffers a compiled program writes to HBM.

Everything here imports JAX lazily, like :mod:`labkit.xla.aot`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from labkit.xla import hlo

CUDNN_WHEEL = "nvidia-cudnn-cu12"

if TYPE_CHECKING:  # JAX is imported lazily
    import jax

# q, k, v of shape (batch, seq, heads, head_dim) -> attention output of the same shape.
type Attention = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def plain_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal attention as a JAX user writes it: the full (batch, heads, seq, seq) scores."""
    import jax
    import jax.numpy as jnp

    seq, head_dim = q.shape[1], q.shape[3]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)  # (batch, heads, seq, seq)
    s = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), s, -jnp.inf)
    p = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(q.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal attention through cuDNN's fused kernel (GPU only: ``implementation="cudnn"``)."""
    import jax

    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")


def default_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """``jax.nn.dot_product_attention`` with no ``implementation``: what JAX picks by itself."""
    import jax

    return jax.nn.dot_product_attention(q, k, v, is_causal=True)


def with_grad(
    attention: Attention,
) -> Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]:
    """Forward and backward: the gradient of ``sum(attention(q, k, v))`` in q, k and v."""
    import jax
    import jax.numpy as jnp

    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return attention(q, k, v).astype(jnp.float32).sum()

    return jax.grad(loss, argnums=(0, 1, 2))


def cudnn_installed() -> str | None:
    """The installed ``nvidia-cudnn-cu12`` version when its library is present, else None.

    XLA needs that library to build cuDNN attention calls, even for a compile-only GPU.
    """
    try:
        version = importlib.metadata.version(CUDNN_WHEEL)
        spec = importlib.util.find_spec("nvidia.cudnn")
    except (importlib.metadata.PackageNotFoundError, ModuleNotFoundError):
        return None
    paths = list(spec.submodule_search_locations or []) if spec else []
    return version if any((Path(p) / "lib" / "libcudnn.so.9").exists() for p in paths) else None


def score_buffers(text: str, batch: int, heads: int, seq: int) -> list[tuple[str, int]]:
    """Kernel results shaped like the score matrix, (batch, heads, seq, seq): (dtype, bytes).

    Only top-level kernels (entry computation) count: those results are written to HBM.
    Dimensions of size 1 are ignored on both sides (XLA drops a batch of 1 from its shapes).
    """
    dims = [d for d in (batch, heads, seq, seq) if d != 1]
    found = []
    for inst in hlo.entry_computation(text):
        if inst.opcode in ("parameter", "bitcast", "tuple", "get-tuple-element"):
            continue
        for dtype, shape in re.findall(r"(\w+)\[([\d,]*)\]", inst.shape):
            if [int(d) for d in shape.split(",") if d and int(d) != 1] == dims:
                found.append((dtype, hlo.shape_bytes(f"{dtype}[{shape}]")))
    return found
