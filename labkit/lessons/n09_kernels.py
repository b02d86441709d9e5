"""09_kernels: attention three ways compiled for an H100, GPU timings, and the checkers.

The kernels themselves (Pallas matmul, softmax, flash attention, a Mosaic GPU kernel) and
the HLO readers live in :mod:`labkit.kernels`; this module runs the notebook's comparisons.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from labkit import kernels
from labkit.core.feedback import Feedback, check_integer, judge, unanswered
from labkit.core.timing import Timing, timeit
from labkit.gpt.config import GPTConfig
from labkit.xla import hlo

ATTENTION: dict[str, Callable[..., Any]] = {
    "plain JAX": kernels.plain_attention,
    "Pallas flash": kernels.flash_attention,
    "cuDNN fused": kernels.cudnn_attention,
}
SMEM_EXERCISE = {"size": 1024, "block_m": 256, "block_n": 256, "itemsize": 2}


def attention_inputs(cfg: GPTConfig, batch: int, dtype: Any = None) -> tuple[Any, Any, Any]:
    """Random q, k, v of the GPT's attention shapes: (batch, seq, heads, head_dim), bf16."""
    import jax
    import jax.numpy as jnp

    shape = (batch, cfg.seq_len, cfg.num_heads, cfg.head_dim)
    keys = jax.random.split(jax.random.key(0), 3)
    return tuple(jax.random.normal(k, shape, dtype or jnp.bfloat16) for k in keys)  # type: ignore[return-value]


@dataclasses.dataclass(frozen=True)
class AttentionProgram:
    """One attention variant compiled for one H100: its kernels and score-matrix buffers."""

    name: str
    pass_: str  # "forward" or "forward + backward"
    kernels: dict[str, int]
    score_buffers: list[tuple[str, int]]
    hlo: str

    def row(self) -> dict[str, Any]:
        """A table row: kernels launched, and score-matrix bytes written to HBM."""
        return {
            "attention": self.name,
            "pass": self.pass_,
            "kernels": sum(self.kernels.values()),
            "custom calls": ", ".join(k for k in sorted(self.kernels) if k.startswith("__")) or "-",
            "score buffers": len(self.score_buffers),
            "score bytes": sum(b for _, b in self.score_buffers),
        }


def compile_attention(
    name: str, q: Any, k: Any, v: Any, backward: bool = False
) -> AttentionProgram:
    """Compile one of :data:`ATTENTION` (forward, or forward and backward) for one H100."""
    if name not in ATTENTION:
        raise ValueError(f"unknown attention {name!r}; choose one of {list(ATTENTION)}")
    fn = kernels.with_grad(ATTENTION[name]) if backward else ATTENTION[name]
    text = kernels.compile_kernel_for_h100(fn, q, k, v).hlo
    batch, seq, heads, _ = q.shape
    return AttentionProgram(
        name,
        "forward + backward" if backward else "forward",
        hlo.kernel_counts(text),
        kernels.score_buffers(text, batch, heads, seq),
        text,
    )


def time_attention(q: Any, k: Any, v: Any, repeats: int = 20) -> dict[str, Timing]:
    """Measured forward time of each attention variant on the local GPU (jit, warm-up)."""
    import jax

    return {name: timeit(jax.jit(fn), q, k, v, repeats=repeats) for name, fn in ATTENTION.items()}


# ---------------------------------------------------------------------------------------
# Checkers


def largest_fitting_block_k(
    size: int, block_m: int, block_n: int, itemsize: int, limit: int = kernels.H100_SMEM_OPTIN
) -> int:
    """The largest power-of-two block_k (>= 16, dividing ``size``) whose tile fits ``limit``."""
    best = 0
    block_k = 16
    while block_k <= size:
        if (
            size % block_k == 0
            and kernels.matmul_smem_bytes(block_m, block_n, block_k, itemsize) <= limit
        ):
            best = block_k
        block_k *= 2
    return best


def check_block_k(answer: Any) -> Feedback:
    """09.1: the largest block_k for 256 x 256 bf16 tiles that fits H100 shared memory."""
    e = SMEM_EXERCISE
    expected = largest_fitting_block_k(e["size"], e["block_m"], e["block_n"], e["itemsize"])
    if unanswered(answer):
        return judge("09.1", answer, False, "", "")
    need = kernels.matmul_smem_bytes(e["block_m"], e["block_n"], int(answer), e["itemsize"])
    hint = (
        f"block_k={answer} asks for {need} bytes with {kernels.TRITON_NUM_STAGES} stages; "
        f"the limit is {kernels.H100_SMEM_OPTIN}. Use kernels.matmul_smem_bytes and try "
        "powers of two."
    )
    return check_integer(
        "09.1",
        answer,
        expected,
        f"block_k={expected}: {need} of {kernels.H100_SMEM_OPTIN} bytes.",
        hint,
    )


def check_score_bytes(answer: Any, cfg: GPTConfig, batch: int) -> Feedback:
    """09.2: HBM bytes of one bf16 score matrix (batch, heads, seq, seq) of the given GPT."""
    expected = batch * cfg.num_heads * cfg.seq_len**2 * 2
    return check_integer(
        "09.2",
        answer,
        expected,
        f"{expected} bytes, written and read again by plain attention.",
        "batch x heads x seq x seq elements, 2 bytes each in bf16.",
    )


def check_triton_target(answer: Any, program_hlo: str) -> Feedback:
    """09.3: the custom-call target a Pallas (Triton) kernel becomes in the H100 program."""
    targets = [t for t in hlo.kernel_counts(program_hlo) if t.startswith("__gpu")]
    passed = not unanswered(answer) and isinstance(answer, str) and answer.strip() in targets
    return judge(
        "09.3",
        answer,
        passed,
        f"{answer} is XLA's Triton custom call for Pallas kernels.",
        "Look at hlo.kernel_counts(flash_fwd.hlo): the key that starts with '__gpu'.",
    )
