"""02_stablehlo_export: the GPT as a pure function for export, int8 quantization, checkers.

The export machinery (front ends, save, load, checks, fresh process) lives in
:mod:`labkit.export`; this module builds the lesson's functions from the kit's GPT and
checks the exercises.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.typing import ArrayLike

from labkit.core.feedback import Feedback, check_integer, check_number, judge, unanswered
from labkit.core.mesh import abstract
from labkit.core.types import CompilerOption, PyTree
from labkit.export import int_keys, max_rel_error, string_keys
from labkit.gpt import data, train
from labkit.gpt.config import GPTConfig
from labkit.gpt.model import GPT
from labkit.xla.aot import AotResult, compile_for_gpu, h100_mesh
from labkit.xla.hlo import op_histogram


def train_briefly(
    cfg: GPTConfig, steps: int, batch_size: int, lr: float = 3e-3, seed: int = 0
) -> tuple[GPT, np.ndarray]:
    """Train the GPT a few AdamW steps on the kit's corpus; the model and its losses."""
    model = train.create_model(cfg, seed=seed)
    optimizer = train.make_optimizer(model, lr)
    tokens = data.encode(data.corpus())
    batches = data.batches(tokens, batch_size, cfg.seq_len, seed=seed, steps=steps)
    losses = [train.train_step(model, optimizer, jnp.asarray(batch)) for batch in batches]
    return model, np.asarray(jax.device_get(losses), np.float64)  # (steps,)


def pure_forward(model: GPT) -> tuple[Callable[[PyTree, jax.Array], jax.Array], dict[str, PyTree]]:
    """``(fn, params)``: ``fn(params, tokens) -> logits`` with params as a plain dict.

    ``params`` is ``nnx.to_pure_dict`` of the model's state with string keys (export
    serializes only string-keyed dicts; ``nnx.List`` indices are ints). ``fn`` rebuilds the
    model inside the traced function with ``nnx.replace_by_pure_dict`` on a copy of the state.
    """
    graphdef, state = nnx.split(model)

    def fn(params: PyTree, tokens: jax.Array) -> jax.Array:
        fresh = jax.tree.map(lambda x: x, state)  # new Variables, so the trace may fill them
        nnx.replace_by_pure_dict(fresh, int_keys(params))
        return nnx.merge(graphdef, fresh)(tokens)  # (batch, seq, vocab)

    return fn, string_keys(nnx.to_pure_dict(state))


def tokens_of(text: str, batch: int, seq: int) -> np.ndarray:
    """``(batch, seq)`` int32 bytes of ``text``, cycled."""
    raw = np.frombuffer((text * (batch * seq // max(len(text), 1) + 1)).encode(), np.uint8)
    return raw[: batch * seq].astype(np.int32).reshape(batch, seq)


# ---------------------------------------------------------------------------------------
# Post-training int8


@dataclasses.dataclass(frozen=True)
class Int8Weight:
    """A weight ``(in, out)`` as int8 with a float32 scale per output channel (or one)."""

    q: np.ndarray  # int8 (in, out)
    scale: np.ndarray  # float32 (out,) per channel, or (1,) per tensor


def quantize_weight(w: ArrayLike, per_channel: bool = True) -> Int8Weight:
    """Symmetric int8: ``w ~= q * scale``, scale = max|w| / 127 per output column or tensor."""
    w = np.asarray(w, np.float32)  # (in, out)
    amax = np.abs(w).max(axis=0) if per_channel else np.abs(w).max(keepdims=True)[0]
    scale = np.maximum(amax, 1e-12).astype(np.float32) / 127.0  # (out,) or (1,)
    q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
    return Int8Weight(q, scale.reshape(-1))


def int8_linear(x: jax.Array, q: ArrayLike, w_scale: ArrayLike) -> jax.Array:
    """``x @ w`` in int8: x quantized per row on the fly, int8 x int8 -> int32, then rescaled.

    x: float ``(..., in)``; q: int8 ``(in, out)``; w_scale: float32 ``(out,)`` or ``(1,)``.
    """
    x_scale = jnp.maximum(jnp.abs(x).max(axis=-1, keepdims=True), 1e-12) / 127.0  # (..., 1)
    xq = jnp.clip(jnp.round(x / x_scale), -127, 127).astype(jnp.int8)  # (..., in)
    acc = jax.lax.dot_general(
        xq, q, (((x.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.int32
    )  # (..., out)
    return acc.astype(jnp.float32) * x_scale * w_scale  # (..., out)


def up_projection(model: GPT, layer: int = 0) -> np.ndarray:
    """The MLP up-projection kernel ``(d_model, d_ff)`` of one block (the kit's GPT has no bias)."""
    return np.asarray(model.blocks[layer].mlp.up.kernel[...])


def int8_error(x: ArrayLike, w: ArrayLike, per_channel: bool = True) -> float:
    """Max relative error of :func:`int8_linear` against the float32 ``x @ w``."""
    qw = quantize_weight(w, per_channel)
    return max_rel_error(int8_linear(jnp.asarray(x), qw.q, qw.scale), np.asarray(x) @ np.asarray(w))


def int8_linear_h100(
    tokens: int, d_in: int, d_out: int, num_gpus: int = 1, **options: CompilerOption
) -> AotResult:
    """:func:`int8_linear` on ``(tokens, d_in)`` compiled for H100s (compiled, not run)."""
    mesh = h100_mesh((num_gpus,), ("data",))
    x = abstract(jax.ShapeDtypeStruct((tokens, d_in), jnp.float32), mesh, jax.P("data"))
    q = abstract(jax.ShapeDtypeStruct((d_in, d_out), jnp.int8), mesh)
    s = abstract(jax.ShapeDtypeStruct((d_out,), jnp.float32), mesh)
    return compile_for_gpu(int8_linear, x, q, s, compiler_options=options or None)


# ---------------------------------------------------------------------------------------
# Checkers


def check_dot_count(answer: object, stablehlo: str) -> Feedback:
    """02.1: how many ``stablehlo.dot_general`` ops the forward pass's StableHLO has."""
    expected = op_histogram(stablehlo)["stablehlo.dot_general"]
    return check_integer(
        "02.1",
        answer,
        expected,
        f"{expected}: per block q, k, v, the two attention products (scores, weighted "
        "values), the output projection and the MLP's two layers, plus the vocabulary head.",
        "count the lines whose op is stablehlo.dot_general: "
        "labkit.xla.hlo.op_histogram(text)['stablehlo.dot_general']",
    )


def _spec(answer: Any) -> tuple[str, tuple[str, ...]]:
    if isinstance(answer, str):
        return answer, ()
    spec, constraints = answer
    return str(spec), tuple(constraints)


def check_token_spec(answer: object, max_len: int = 32) -> Feedback:
    """02.2: a ``symbolic_shape`` spec (and constraints) for tokens: any batch, seq <= max_len.

    ``answer`` is a spec string or ``(spec, constraints)``.
    """
    if unanswered(answer):
        return judge("02.2", answer, False, "", "")
    try:
        spec, constraints = _spec(answer)
        dims = jax.export.symbolic_shape(spec, constraints=constraints)
    except (ValueError, TypeError) as err:
        return Feedback("02.2", False, True, f"jax.export.symbolic_shape rejects it: {err}")
    if len(dims) != 2 or not all(jax.export.is_symbolic_dim(d) for d in dims):
        return Feedback(
            "02.2", False, True, f"tokens are (batch, seq): give two symbols, got {dims}"
        )
    (b_lo, b_hi), (t_lo, t_hi) = (jax.export.symbolic_dim_bounds(d) for d in dims)
    ok = b_hi == float("inf") and t_lo >= 1 and t_hi == max_len
    return judge(
        "02.2",
        answer,
        ok,
        f"right: batch in [{b_lo:g}, inf), seq in [{t_lo:g}, {t_hi:g}].",
        f"JAX proves batch in [{b_lo:g}, {b_hi:g}], seq in [{t_lo:g}, {t_hi:g}]; the batch "
        f"must stay free and seq be at most {max_len}: add a constraint such as 't <= ...'",
    )


def check_per_tensor_error(answer: object, x: ArrayLike, w: ArrayLike) -> Feedback:
    """02.3: the max relative error of the int8 layer with one scale for the whole weight."""
    expected = int8_error(x, w, per_channel=False)
    per_channel = int8_error(x, w, per_channel=True)
    return check_number(
        "02.3",
        answer,
        expected,
        0.02,
        f"recompute with int8_error(x, w, per_channel=False) (per channel it is "
        f"{per_channel:.4f}): one scale must cover the largest column, so small columns "
        "keep fewer levels",
    )


def check_int8_error(answer: object, acts: ArrayLike, w: ArrayLike) -> Feedback:
    """02.p1 (predict): the int8 per-channel layer's error against float32, within 2x."""
    if unanswered(answer):
        return judge("02.p1", answer, False, "", "")
    qw = quantize_weight(w)
    expected = max_rel_error(int8_linear(jnp.asarray(acts), qw.q, qw.scale), np.asarray(acts) @ w)
    try:
        ratio = float(answer) / expected  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return Feedback("02.p1", False, True, f"expected a number, got {type(answer).__name__}")
    return judge(
        "02.p1",
        answer,
        0.5 <= ratio <= 2,
        f"within 2x of {expected:.2g} (max |error| / max |y|).",
        f"{expected:.2g}, not within 2x of your {answer}: an int8 step is max|w| / 127 per column",
    )
