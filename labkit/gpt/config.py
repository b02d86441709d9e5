"""The GPT's configuration: sizes, numerics, named presets, parameter and FLOP counts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from labkit.core.types import JSON


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """Shape and numerics of a byte-level GPT (no dropout)."""

    vocab_size: int = 256
    seq_len: int = 128
    d_model: int = 128
    num_heads: int = 4
    num_layers: int = 2
    d_ff: int = 512
    dtype: DTypeLike = jnp.float32  # compute dtype of activations and matmuls
    param_dtype: DTypeLike = jnp.float32  # storage dtype of parameters
    tie_embeddings: bool = False  # output head reuses the token embedding
    # Stack the blocks' params on a leading "layers" axis and run them with nnx.scan: one
    # compiled block in a while loop instead of num_layers unrolled copies.
    scan_layers: bool = False
    # Replaces jax.lax.dot_general in every nnx.Linear (q, k, v, o, MLP, head): the FP8 hook.
    # Called as fn(lhs, rhs, dimension_numbers, precision=..., **kwargs).
    dot_general: Callable[..., jax.Array] | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "d_model", "num_heads", "num_layers", "d_ff"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {value!r}")
        if self.d_model % self.num_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads}); "
                f"try num_heads in {[h for h in range(1, 17) if self.d_model % h == 0]}"
            )
        for name in ("dtype", "param_dtype"):
            try:
                dt = jnp.dtype(getattr(self, name))
            except TypeError as err:
                raise ValueError(
                    f"GPTConfig.{name} is not a dtype: {getattr(self, name)!r}"
                ) from err
            if not jnp.issubdtype(dt, jnp.floating):
                raise ValueError(f"GPTConfig.{name} must be a float dtype, got {dt}")
            object.__setattr__(self, name, dt)  # one spelling, so equal configs hash equal
        if self.dot_general is not None and not callable(self.dot_general):
            raise ValueError(
                f"GPTConfig.dot_general must be callable or None, got {self.dot_general!r}"
            )

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.num_heads

    @classmethod
    def of(cls, cfg: GPTConfig | str) -> GPTConfig:
        """``cfg`` itself, or the preset it names (unknown names list the valid ones)."""
        return cfg if isinstance(cfg, GPTConfig) else cls.preset(cfg)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> GPTConfig:
        """A named size from :data:`PRESETS`, with fields overridden by keyword."""
        if not isinstance(name, str) or name not in PRESETS:
            raise ValueError(f"unknown GPT preset {name!r}; choose one of {sorted(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)

    def sizes(self) -> dict[str, int]:
        """Sizes of the logical axes that sharding rules split (``labkit.parallel.sharding``)."""
        return {
            "heads": self.num_heads,
            "mlp": self.d_ff,
            "embed": self.d_model,
            "vocab": self.vocab_size,
        }

    @classmethod
    def tiny(cls, **overrides: Any) -> GPTConfig:
        """CPU CI size: d_model 64, 2 layers, seq 64 (about 0.1 M params)."""
        return cls.preset("tiny", **overrides)

    @classmethod
    def small(cls, **overrides: Any) -> GPTConfig:
        """CPU lesson size: d_model 128, 2 layers, seq 128 (about 0.5 M params)."""
        return cls.preset("small", **overrides)


PRESETS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(seq_len=64, d_model=64, num_heads=4, num_layers=2, d_ff=256),
    "small": GPTConfig(seq_len=128, d_model=128, num_heads=4, num_layers=2, d_ff=512),
    # GPU mode: GPT-2 small's body (85 M non-embedding params), byte-level vocabulary.
    "base": GPTConfig(seq_len=1024, d_model=768, num_heads=12, num_layers=12, d_ff=3072),
}


# ---------------------------------------------------------------------------------------
# Size and FLOPs


def param_count(cfg: GPTConfig) -> int:
    """Number of parameters of ``GPT(cfg)``, embeddings included."""
    d = cfg.d_model
    per_block = 4 * d * d + 2 * d * cfg.d_ff + 2 * (2 * d)  # attention, MLP, two LayerNorms
    embeddings = cfg.vocab_size * d + cfg.seq_len * d
    head = 0 if cfg.tie_embeddings else d * cfg.vocab_size
    return embeddings + cfg.num_layers * per_block + 2 * d + head


def matmul_param_count(cfg: GPTConfig) -> int:
    """Weights that enter a matmul once per token: the blocks' projections and the vocab head."""
    return cfg.num_layers * (4 * cfg.d_model**2 + 2 * cfg.d_model * cfg.d_ff) + (
        cfg.d_model * cfg.vocab_size
    )


def flops_per_token(cfg: GPTConfig, seq_len: int | None = None) -> int:
    """Training FLOPs per token (forward + backward): ``6 N + 12 L T d``.

    ``N`` is :func:`matmul_param_count` (non-embedding weights plus the output projection,
    which costs a matmul even when tied; lookups and LayerNorms are left out), ``L`` layers,
    ``T`` the sequence length, ``d`` d_model. ``6 N``: 2 FLOPs per weight per token forward,
    twice that backward (Kaplan et al. 2020, "Scaling Laws for Neural Language Models",
    section 2.1). ``12 L T d``: the attention score and value matmuls, counted without the
    causal halving as in PaLM (Chowdhery et al. 2022), appendix B, which uses this sum for MFU.
    """
    t = cfg.seq_len if seq_len is None else seq_len
    return 6 * matmul_param_count(cfg) + 12 * cfg.num_layers * t * cfg.d_model


def config_to_json(cfg: GPTConfig) -> dict[str, JSON]:
    """The config as plain JSON data (dtypes by name), to hand to another process."""
    if cfg.dot_general is not None:
        raise ValueError(
            "a GPTConfig with a custom dot_general cannot be sent to another process; "
            "compile it in this one with labkit.gpt.compile.compile_train_step"
        )
    out: dict[str, JSON] = dataclasses.asdict(cfg)
    for name in ("dtype", "param_dtype"):
        out[name] = jnp.dtype(getattr(cfg, name)).name
    del out["dot_general"]
    return out


def config_from_json(data: Mapping[str, JSON]) -> GPTConfig:
    """The inverse of :func:`config_to_json`."""
    fields: dict[str, Any] = dict(data)  # checked by GPTConfig.__post_init__
    for name in ("dtype", "param_dtype"):
        fields[name] = jnp.dtype(fields[name])
    return GPTConfig(**fields)
