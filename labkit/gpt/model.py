"""A small decoder-only GPT in Flax NNX, shared by every notebook that trains a model.

Parameters carry logical axis names; :mod:`labkit.parallel.sharding` maps them to mesh axes per
strategy, and :mod:`labkit.gpt.train` trains the model (stateful NNX, or pure functions for
``jax.jit`` with explicit shardings and deviceless H100 compiles). With
``GPTConfig(scan_layers=True)`` the blocks' params are stacked on a leading ``"layers"`` axis
and run by ``nnx.scan``: the compiled step holds one block inside a while loop.

A batch is always int32 ``(batch, seq_len + 1)``: inputs are ``batch[:, :-1]``, next-byte
targets are ``batch[:, 1:]``.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from labkit.gpt.config import GPTConfig
from labkit.parallel.sharding import RESIDUAL, constrain

# ---------------------------------------------------------------------------------------
# The model


def _init(std: float, names: tuple[str | None, ...]) -> jax.nn.initializers.Initializer:
    return nnx.with_partitioning(nnx.initializers.normal(std), names)


class Linear(nnx.Linear):
    """``nnx.Linear`` that multiplies a 2-D ``(tokens, d_in)`` matrix, whatever the leading axes.

    Same params and result as ``nnx.Linear``. The reshape is free (a bitcast), but it changes
    the backward pass: autodiff then writes the kernel's gradient as a plain 2-D matmul of
    ``(tokens, d_in)`` and ``(tokens, d_out)``, whose transposed operand XLA folds into the GEMM
    call. From a 3-D ``(batch, seq, d)`` input, XLA:CPU instead materialised the transpose of
    the ``(batch, seq, d_ff)`` gradient, fused with GELU's backward: a quarter of the whole
    CPU train step (``benchmarks/capstone_bench.py``).
    """

    def __call__(self, inputs: jax.Array, out_sharding: object = None) -> jax.Array:
        """``inputs @ kernel`` for ``inputs`` of shape ``(..., d_in)``: ``(..., d_out)``."""
        if out_sharding is not None:
            raise ValueError("labkit's Linear pins shardings with constrain(), not out_sharding")
        lead = inputs.shape[:-1]
        out = super().__call__(inputs.reshape(-1, inputs.shape[-1]))  # (tokens, d_out)
        return out.reshape(*lead, out.shape[-1])  # (..., d_out)


def _linear(
    cfg: GPTConfig, d_in: int, d_out: int, names: tuple[str, str], std: float, rngs: nnx.Rngs
) -> Linear:
    return Linear(
        d_in,
        d_out,
        use_bias=False,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        kernel_init=_init(std, names),
        dot_general=cfg.dot_general or jax.lax.dot_general,
        rngs=rngs,
    )


def _layer_norm(cfg: GPTConfig, rngs: nnx.Rngs) -> nnx.LayerNorm:
    return nnx.LayerNorm(
        cfg.d_model,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        scale_init=nnx.with_partitioning(nnx.initializers.ones_init(), ("embed",)),
        bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), ("embed",)),
        rngs=rngs,
    )


class Attention(nnx.Module):
    """Causal multi-head self-attention written as explicit einsums."""

    def __init__(self, cfg: GPTConfig, rngs: nnx.Rngs):
        d, out_std = cfg.d_model, 0.02 / math.sqrt(2 * cfg.num_layers)  # GPT-2 residual scaling
        self.num_heads, self.dtype = cfg.num_heads, cfg.dtype
        self.q = _linear(cfg, d, d, ("embed", "heads"), 0.02, rngs)
        self.k = _linear(cfg, d, d, ("embed", "heads"), 0.02, rngs)
        self.v = _linear(cfg, d, d, ("embed", "heads"), 0.02, rngs)
        self.o = _linear(cfg, d, d, ("heads", "embed"), out_std, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape  # (batch, seq, d_model)
        h = self.num_heads
        heads = ("batch", None, "heads", None)
        q = constrain(self.q(x).reshape(b, t, h, d // h), heads)  # (batch, seq, heads, head_dim)
        k = constrain(self.k(x).reshape(b, t, h, d // h), heads)  # (batch, seq, heads, head_dim)
        v = constrain(self.v(x).reshape(b, t, h, d // h), heads)  # (batch, seq, heads, head_dim)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d // h)  # (batch, heads, seq, seq)
        causal = jnp.tril(jnp.ones((t, t), dtype=bool))  # (seq, seq): query i sees keys <= i
        scores = jnp.where(causal, scores.astype(jnp.float32), jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(self.dtype)  # (batch, heads, seq, seq)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)  # (batch, seq, d_model)
        return self.o(out)  # (batch, seq, d_model)


class MLP(nnx.Module):
    """Position-wise feed-forward: d_model -> d_ff -> GELU -> d_model."""

    def __init__(self, cfg: GPTConfig, rngs: nnx.Rngs):
        out_std = 0.02 / math.sqrt(2 * cfg.num_layers)
        self.up = _linear(cfg, cfg.d_model, cfg.d_ff, ("embed", "mlp"), 0.02, rngs)
        self.down = _linear(cfg, cfg.d_ff, cfg.d_model, ("mlp", "embed"), out_std, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        hidden = constrain(jax.nn.gelu(self.up(x)), ("batch", None, "mlp"))  # (batch, seq, d_ff)
        return self.down(hidden)  # (batch, seq, d_model)


class Block(nnx.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig, rngs: nnx.Rngs):
        self.ln1 = _layer_norm(cfg, rngs)
        self.attn = Attention(cfg, rngs)
        self.ln2 = _layer_norm(cfg, rngs)
        self.mlp = MLP(cfg, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = constrain(x + self.attn(self.ln1(x)), RESIDUAL)  # (batch, seq, d_model)
        return constrain(x + self.mlp(self.ln2(x)), RESIDUAL)  # (batch, seq, d_model)


def _stacked_blocks(cfg: GPTConfig, rngs: nnx.Rngs) -> Block:
    """One Block whose params have a leading ``(num_layers, ...)`` axis named "layers"."""

    @nnx.split_rngs(splits=cfg.num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def make(rngs: nnx.Rngs) -> Block:
        return Block(cfg, rngs)

    return make(rngs)


@nnx.scan(
    in_axes=(nnx.Carry, 0), out_axes=nnx.Carry, transform_metadata={nnx.PARTITION_NAME: "layers"}
)
def _scan_blocks(x: jax.Array, block: Block) -> jax.Array:
    return block(x)  # (batch, seq, d_model), one layer per iteration


class GPT(nnx.Module):
    """Decoder-only transformer: embeddings, ``num_layers`` blocks, final norm, vocab head.

    Parameters are created *unsharded* with logical axis names in their metadata (eager
    sharding is switched off so the model builds anywhere); :func:`create_model` or
    :func:`init_train_state` place them on a mesh by a strategy.
    """

    def __init__(self, cfg: GPTConfig, rngs: nnx.Rngs):
        self.config = cfg
        with nnx.use_eager_sharding(False):
            self.tok_embed = nnx.Embed(
                cfg.vocab_size,
                cfg.d_model,
                dtype=cfg.dtype,
                param_dtype=cfg.param_dtype,
                embedding_init=_init(0.02, ("vocab", "embed")),
                rngs=rngs,
            )
            self.pos_embed = nnx.Embed(
                cfg.seq_len,
                cfg.d_model,
                dtype=cfg.dtype,
                param_dtype=cfg.param_dtype,
                embedding_init=_init(0.01, (None, "embed")),
                rngs=rngs,
            )
            self.blocks: Any  # one stacked Block (scan_layers) or an nnx.List of Blocks
            if cfg.scan_layers:
                self.blocks = _stacked_blocks(cfg, rngs)
            else:
                self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_layers)])
            self.ln_f = _layer_norm(cfg, rngs)
            self.head = (
                None
                if cfg.tie_embeddings
                else _linear(cfg, cfg.d_model, cfg.vocab_size, ("embed", "vocab"), 0.02, rngs)
            )

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Logits ``(batch, seq, vocab)`` in the compute dtype for int tokens ``(batch, seq)``."""
        if tokens.ndim != 2 or tokens.shape[1] > self.config.seq_len:
            raise ValueError(
                f"tokens must be (batch, seq) with seq <= seq_len={self.config.seq_len}, "
                f"got shape {tokens.shape}"
            )
        t = tokens.shape[1]
        # Gather the table whole before the lookup (what FSDP means), instead of leaving the
        # partitioner to move the lookup's gradient from batch- to embed-sharding.
        table = constrain(self.tok_embed.embedding[...], ("vocab", None))  # (vocab, d_model)
        x = jnp.take(table, tokens, axis=0) + self.pos_embed.embedding[:t]  # (batch, seq, d_model)
        x = x.astype(self.config.dtype)  # (batch, seq, d_model)
        x = constrain(x, RESIDUAL)  # (batch, seq, d_model)
        if self.config.scan_layers:
            x = _scan_blocks(x, self.blocks)  # (batch, seq, d_model)
        else:
            for block in self.blocks:
                x = block(x)  # (batch, seq, d_model)
        x = self.ln_f(x)  # (batch, seq, d_model)
        if self.head is None:
            return self.tok_embed.attend(x)  # (batch, seq, vocab)
        return self.head(x)  # (batch, seq, vocab)
