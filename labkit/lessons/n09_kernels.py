"""09_kernels: attention four ways compiled for an H100, GPU timings, and the checkers.

The kernels live in :mod:`labkit.kernels.pallas` (Mosaic GPU matmul and softmax, the deprecated
Triton matmul) and :mod:`labkit.kernels.flash` (causal flash attention, forward and backward); the
attention variants and HLO readers in :mod:`labkit.kernels.attention`; this module runs the
notebook's comparisons. Run as ``python -m labkit.lessons.n09_kernels b200``, it is the fresh
process of :func:`b200_matmul_in_fresh_process`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, SupportsIndex, SupportsInt

from labkit.core.feedback import YES_NO, Feedback, check_choice, check_integer, judge, unanswered
from labkit.core.timing import Timing, timeit
from labkit.gpt.config import GPTConfig
from labkit.kernels import attention, flash, pallas
from labkit.kernels.gpu_code import redirect_fd
from labkit.xla import hlo
from labkit.xla.flags import emit, run_with_flags

if TYPE_CHECKING:
    import jax

ATTENTION: dict[str, attention.Attention] = {
    "plain JAX": attention.plain_attention,
    "jax.nn default": attention.default_attention,
    "kit flash (Mosaic GPU)": flash.flash_attention,
    "cuDNN fused": attention.cudnn_attention,
}
HOPPER_ONLY = frozenset({"kit flash (Mosaic GPU)"})  # Mosaic GPU's wgmma: sm_90 only
NEEDS_CUDNN = frozenset({"cuDNN fused"})  # needs the nvidia-cudnn-cu12 wheel's library
# 09.1: bf16 x bf16 -> f32 tiles of 128 x 256 with 2 pipeline steps (pallas.matmul's layout)
SMEM_EXERCISE = {"tile_m": 128, "tile_n": 256, "steps": 2, "itemsize": 2, "out_itemsize": 4}


def attention_inputs(
    cfg: GPTConfig, batch: int, seq: int | None = None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Random q, k, v of the GPT's attention shapes, (batch, seq, heads, head_dim), bf16."""
    import jax
    import jax.numpy as jnp

    shape = (batch, seq or cfg.seq_len, cfg.num_heads, cfg.head_dim)
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, shape, jnp.bfloat16) for key in keys)
    return q, k, v


@dataclasses.dataclass(frozen=True)
class AttentionProgram:
    """One attention variant compiled for one H100: its kernels and score-matrix buffers."""

    name: str
    pass_: str  # "forward" or "forward + backward"
    kernels: dict[str, int]
    score_buffers: list[tuple[str, int]]
    hlo: str

    def row(self) -> dict[str, str | int]:
        """A table row: kernels launched, and score-matrix bytes written to HBM."""
        return {
            "attention": self.name,
            "pass": self.pass_,
            "kernels": sum(self.kernels.values()),
            "custom calls": ", ".join(k for k in sorted(self.kernels) if not k.startswith("k"))
            or "-",
            "score buffers": len(self.score_buffers),
            "score bytes": sum(b for _, b in self.score_buffers),
        }


def compile_attention(
    name: str, q: jax.Array, k: jax.Array, v: jax.Array, backward: bool = False
) -> AttentionProgram:
    """Compile one of :data:`ATTENTION` (forward, or forward and backward) for one H100."""
    if name not in ATTENTION:
        raise ValueError(f"unknown attention {name!r}; choose one of {list(ATTENTION)}")
    fn = attention.with_grad(ATTENTION[name]) if backward else ATTENTION[name]
    text = pallas.compile_kernel_for_h100(fn, q, k, v).hlo
    batch, seq, heads, _ = q.shape
    return AttentionProgram(
        name,
        "forward + backward" if backward else "forward",
        hlo.kernel_counts(text),
        attention.score_buffers(text, batch, heads, seq),
        text,
    )


def left_out(capability: tuple[int, int], cudnn: bool = True) -> dict[str, str]:
    """The variants of :data:`ATTENTION` that a GPU of this compute capability cannot run
    here, and why: the kit's Mosaic GPU kernels issue Hopper's ``wgmma``, which only sm_90
    has (not an A100, sm_80, nor a B200, sm_100); cuDNN's needs its wheel (``cudnn``)."""
    major, minor = tuple(capability)
    out: dict[str, str] = {}
    if major != 9:
        out |= dict.fromkeys(
            HOPPER_ONLY, f"sm_{major}{minor}: the kit's Mosaic GPU kernels issue wgmma (sm_90 only)"
        )
    if not cudnn:
        out |= dict.fromkeys(NEEDS_CUDNN, "the nvidia-cudnn-cu12 wheel is not installed")
    return out


def attention_variants(
    capability: tuple[int, int], cudnn: bool = True
) -> dict[str, attention.Attention]:
    """The variants of :data:`ATTENTION` a GPU of this compute capability can run here: all
    but :func:`left_out`'s."""
    out = left_out(capability, cudnn)
    return {n: f for n, f in ATTENTION.items() if n not in out}


def time_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    repeats: int = 20,
    capability: tuple[int, int] = (9, 0),
    cudnn: bool = True,
) -> dict[str, Timing]:
    """Measured forward time of each attention variant the local GPU runs (jit, warm-up)."""
    import jax

    variants = attention_variants(capability, cudnn)
    return {name: timeit(jax.jit(fn), q, k, v, repeats=repeats) for name, fn in variants.items()}


def b200_matmul_in_fresh_process(timeout_s: float = 300.0) -> str:
    """What compiling :func:`pallas.matmul` for a B200 gives in a new Python process.

    ``"COMPILED"``, or the error as ``"Type: message"``; the operands have section 1's
    shapes, (256, 128) and (128, 256) bf16. A new process because jaxlib keeps each Mosaic GPU
    kernel it has assembled and hands it to a later compile of the same kernel, whatever GPU
    that compile is for (:func:`b200_matmul_here`); and after a first compile for a B200 it
    assembles later H100 kernels for sm_100a, which fail (``tests/test_kernels.py``). The
    child compiles around the kit's compile cache, which may hold a B200 program built by
    that reuse.
    """
    env = {"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"}
    run = run_with_flags([], module=__name__, args=["b200"], env=env, timeout_s=timeout_s)
    if run.returncode != 0 or not isinstance(run.result, str):
        raise RuntimeError(
            f"the B200 compile process failed (exit {run.returncode}):\n{run.stderr[-2000:]}"
        )
    return run.result


REUSED = "reused: ptxas never ran"  # what b200_matmul_here says of a kernel assembled before


def b200_matmul_here(x: jax.Array, y: jax.Array) -> str:
    """What compiling :func:`pallas.matmul` of ``x`` and ``y`` for a B200 gives in *this*
    process, read with Mosaic GPU's PTX and ptxas dumps on
    (:func:`labkit.kernels.gpu_code.mosaic_code`): ``"ptxas: sm_..."`` where ptxas assembled
    it, :data:`REUSED` where ptxas reported nothing (jaxlib handed the compile a kernel it
    had assembled before), or the error as ``"Type: message"``."""
    import jax

    from labkit.kernels import gpu_code
    from labkit.xla.aot import abstract, b200_mesh

    mesh = b200_mesh((1,), ("x",))
    args = [abstract(a, mesh) for a in (x, y)]
    try:  # MLIR also prints a refusal on file descriptor 2: the message below has it all
        with redirect_fd(2, os.devnull), jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            code = gpu_code.mosaic_code(pallas.matmul, *args)
    except RuntimeError as exc:  # jaxlib's JaxRuntimeError is one
        if "ptxas reported nothing" in str(exc):
            return REUSED
        return f"{type(exc).__name__}: {exc}"
    return "ptxas: " + ", ".join(code.ptxas_targets())


def _b200_child() -> int:
    """Child side of :func:`b200_matmul_in_fresh_process`: compile, emit what happened."""
    from labkit.core.env import setup

    setup(cpu_devices=1, mode="cpu")
    import jax
    import jax.numpy as jnp

    from labkit.xla.aot import abstract, b200_mesh, compile_for_gpu

    mesh = b200_mesh((1,), ("x",))
    x = abstract(jnp.zeros((256, 128), jnp.bfloat16), mesh)
    y = abstract(jnp.zeros((128, 256), jnp.bfloat16), mesh)
    try:  # not from the kit's compile cache: that may hold a B200 program built by reuse
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            compile_for_gpu(pallas.matmul, x, y, cache=False)
        emit("COMPILED")
    except Exception as exc:  # what Mosaic GPU or ptxas says, for the learner to read
        emit(f"{type(exc).__name__}: {exc}")
    return 0


# ---------------------------------------------------------------------------------------
# Checkers


def largest_fitting_tile_k(
    tile_m: int,
    tile_n: int,
    steps: int,
    itemsize: int,
    out_itemsize: int,
    limit: int = pallas.H100_SMEM_OPTIN,
) -> int:
    """The largest power-of-two tile_k (>= 16) whose :func:`pallas.matmul` tile fits ``limit``."""
    best, tile_k = 0, 16
    while pallas.matmul_smem_bytes(tile_m, tile_n, tile_k, itemsize, steps, out_itemsize) <= limit:
        best, tile_k = tile_k, tile_k * 2
    return best


def check_tile_k(answer: object) -> Feedback:
    """09.1: the largest tile_k for 128 x 256 bf16 tiles, 2 steps, that fits H100 SMEM."""
    e = SMEM_EXERCISE
    expected = largest_fitting_tile_k(**e)
    if unanswered(answer):
        return judge("09.1", answer, False, "", "")
    try:
        if not isinstance(answer, str | bytes | SupportsInt | SupportsIndex):  # what int() takes
            raise TypeError(f"int() cannot take a {type(answer).__name__}")
        need = pallas.matmul_smem_bytes(
            e["tile_m"], e["tile_n"], int(answer), e["itemsize"], e["steps"], e["out_itemsize"]
        )
    except (TypeError, ValueError):
        need = -1
    hint = (
        f"tile_k={answer} asks for {need} bytes with {e['steps']} steps and the f32 output "
        f"tile; the limit is {pallas.H100_SMEM_OPTIN}. Use pallas.matmul_smem_bytes and try "
        "powers of two."
    )
    return check_integer(
        "09.1",
        answer,
        expected,
        f"tile_k={expected}: {need} of {pallas.H100_SMEM_OPTIN} bytes.",
        hint,
    )


def check_score_bytes(answer: object, cfg: GPTConfig, batch: int) -> Feedback:
    """09.2: HBM bytes of one bf16 score matrix (batch, heads, seq, seq) of the given GPT."""
    expected = batch * cfg.num_heads * cfg.seq_len**2 * 2
    return check_integer(
        "09.2",
        answer,
        expected,
        f"{expected} bytes, written and read again by plain attention.",
        "batch x heads x seq x seq elements, 2 bytes each in bf16.",
    )


def check_blocks_visited(answer: object, seq: int = 1024) -> Feedback:
    """09.3: key blocks the causal flash forward reads, in all, for one (batch, head) of ``seq``."""
    expected = sum(flash.kv_blocks_visited(seq))
    full = sum(flash.kv_blocks_visited(seq, causal=False))
    return check_integer(
        "09.3",
        answer,
        expected,
        f"{expected} of {full}: query block i reads key blocks 0..i, 1 + 2 + ... + "
        f"{seq // flash.BLOCK}.",
        f"seq {seq} makes {seq // flash.BLOCK} blocks of {flash.BLOCK}; query block i stops at "
        "the diagonal (labkit.kernels.flash.kv_blocks_visited)",
    )


if __name__ == "__main__":
    if sys.argv[1:] != ["b200"]:
        sys.exit("usage: python -m labkit.lessons.n09_kernels b200")
    sys.exit(_b200_child())


def check_tiles_fit(
    answer: object, tile_m: int = 256, tile_n: int = 256, tile_k: int = 128
) -> Feedback:
    """09.p1 (predict): do the matmul's tiles fit one H100 block's opt-in shared memory
    ("yes" or "no")?"""
    needs = pallas.matmul_smem_bytes(tile_m, tile_n, tile_k)
    expected = "yes" if needs <= pallas.H100_SMEM_OPTIN else "no"
    return check_choice(
        "09.p1",
        answer,
        expected,
        YES_NO,
        f"{expected}: {needs} bytes against {pallas.H100_SMEM_OPTIN}.",
        "count the bytes: stages x (a K slice of x and of y, 2 bytes each) + the f32 tile",
    )


PIPELINE_EXERCISE = {"tile_m": 128, "tile_n": 256, "tile_k": 32}  # 09.4's fixed tiles


def check_pipeline_depth(
    answer: object, compile_kernel: Callable[[dict[str, int]], object] | None = None
) -> Feedback:
    """09.4: ``pallas.matmul`` keyword arguments with :data:`PIPELINE_EXERCISE`'s tiles and
    the most ``steps`` an H100 accepts. Compiles the answer for an H100 (bf16 1024 x 1024
    operands), then with one step more, which must not fit; ``compile_kernel(kwargs)``
    replaces the compile in tests."""
    if unanswered(answer):
        return judge("09.4", answer, False, "", "")
    if not isinstance(answer, dict) or any(
        answer.get(k) != v for k, v in PIPELINE_EXERCISE.items()
    ):
        return Feedback(
            "09.4", False, True, f"give a dict with {PIPELINE_EXERCISE} and your 'steps'"
        )
    steps = answer.get("steps")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        return Feedback("09.4", False, True, f"'steps' must be a whole number >= 1, got {steps!r}")

    def default(kwargs: dict[str, int]) -> object:
        import jax.numpy as jnp

        big = jnp.zeros((1024, 1024), jnp.bfloat16)
        m, n, k, steps = (kwargs[key] for key in ("tile_m", "tile_n", "tile_k", "steps"))
        return pallas.compile_kernel_for_h100(
            lambda a, b: pallas.matmul(a, b, m, n, k, steps=steps), big, big
        )

    def fits(n: int) -> bool:
        try:
            (compile_kernel or default)({**PIPELINE_EXERCISE, "steps": n})
        except ValueError as exc:
            if "exceeds available shared memory" not in str(exc):
                raise
            return False
        return True

    ok = fits(steps) and not fits(steps + 1)
    return judge(
        "09.4",
        answer,
        ok,
        f"{steps} steps in flight: one more would not fit the H100's shared memory.",
        "not the deepest that fits: each step holds a K slice of x and of y (bf16), and the f32 "
        "output tile stays for the whole kernel",
    )
