"""05_fp8: FP8 scaling errors, FP8 GEMMs compiled for H100s, FP8 GPT training, checkers.

The FP8 numerics (scaling, the FP8 ``dot_general``) live in :mod:`labkit.fp8`; this module
runs the notebook's experiments with them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from labkit import fp8
from labkit.core.feedback import Feedback, check_integer, check_number, judge, unanswered
from labkit.core.mesh import abstract, make_mesh
from labkit.gpt import data, train
from labkit.gpt.config import GPTConfig
from labkit.gpt.model import GPT
from labkit.xla.aot import AotResult, compile_for_gpu, h100_mesh
from labkit.xla.gemms import gemms

F8_TARGET = "__cublas$lt$matmul$f8"
NO_TRITON = {"xla_gpu_enable_triton_gemm": False}  # cuBLAS(Lt) for every GEMM


def _dequant_dot(
    lhs_scale_shape: tuple[str, ...],
    op: Callable[[Any], Any] | None = None,
    quantize_out: bool = False,
) -> Callable[..., jax.Array]:
    def fn(a: jax.Array, b: jax.Array, sa: jax.Array, sb: jax.Array) -> jax.Array:
        x = a.astype(jnp.float32) * (sa[:, None] if lhs_scale_shape else sa)  # (m, k)
        x = op(x) if op is not None else x
        out = jnp.dot(x, b.astype(jnp.float32) * sb)  # (m, n)
        return fp8.quantize(out, 1.0, fp8.E4M3) if quantize_out else out

    return fn


# name -> (lhs dtype, rhs dtype, lhs scale shape, op between, quantized output)
GEMM_VARIANTS: dict[str, tuple[Any, Any, tuple[str, ...], Any, bool]] = {
    "scaled e4m3 x e4m3": (fp8.E4M3, fp8.E4M3, (), None, False),
    "scaled e4m3 x e5m2": (fp8.E4M3, fp8.E5M2, (), None, False),
    "scaled, FP8 output": (fp8.E4M3, fp8.E4M3, (), None, True),
    "e5m2 x e5m2": (fp8.E5M2, fp8.E5M2, (), None, False),
    "per-row scale (vector)": (fp8.E4M3, fp8.E4M3, ("m",), None, False),
    "tanh between scale and dot": (fp8.E4M3, fp8.E4M3, (), jnp.tanh, False),
}


def h100_fp8_gemm(
    lhs_dtype: Any = fp8.E4M3,
    rhs_dtype: Any = fp8.E4M3,
    lhs_scale_shape: tuple[str, ...] = (),
    op: Callable[[Any], Any] | None = None,
    quantize_out: bool = False,
    n: int = 512,
    options: dict[str, Any] | None = None,
) -> AotResult:
    """The dequantize -> dot pattern ``(a * sa) @ (b * sb)`` compiled for one H100.

    ``a`` ``(n, n)`` in ``lhs_dtype``, ``b`` ``(n, n)`` in ``rhs_dtype``, float32 scales
    (``lhs_scale_shape`` ``("m",)``: one per row); ``op`` runs between scaling and the dot.
    ``options`` default to :data:`NO_TRITON`.
    """
    mesh = h100_mesh((1,), ("x",))
    a = abstract(jax.ShapeDtypeStruct((n, n), lhs_dtype), mesh)
    b = abstract(jax.ShapeDtypeStruct((n, n), rhs_dtype), mesh)
    sa = abstract(jax.ShapeDtypeStruct((n,) if lhs_scale_shape else (), jnp.float32), mesh)
    sb = abstract(jax.ShapeDtypeStruct((), jnp.float32), mesh)
    fn = _dequant_dot(lhs_scale_shape, op, quantize_out)
    return compile_for_gpu(
        fn, a, b, sa, sb, compiler_options=NO_TRITON if options is None else options
    )


def gemm_kinds(hlo: str) -> list[str]:
    """``"kernel target: lhs x rhs -> out"`` for each GEMM of a compiled module."""
    return [f"{g.kernel} {g.target}: {g.lhs} x {g.rhs} -> {g.out}" for g in gemms(hlo)]


def h100_mxfp8(n: int = 512) -> AotResult:
    """``jax.nn.scaled_dot_general`` with mxfp8 configs (bf16 inputs) compiled for one H100."""
    mesh = h100_mesh((1,), ("x",))
    x = abstract(jax.ShapeDtypeStruct((n, n), jnp.bfloat16), mesh)
    configs = [jax.nn.get_scaled_dot_general_config("mxfp8")] * 3

    def fn(a: jax.Array, b: jax.Array) -> jax.Array:
        dims = (((1,), (0,)), ((), ()))
        return jax.nn.scaled_dot_general(
            a, b, dims, preferred_element_type=jnp.bfloat16, configs=configs
        )

    return compile_for_gpu(fn, x, x, compiler_options=NO_TRITON)


def mxfp8_matmul(a: Any, b: Any) -> jax.Array:
    """``a @ b`` through ``jax.nn.scaled_dot_general`` with mxfp8 (block 32, e8m0 scales)."""
    configs = [jax.nn.get_scaled_dot_general_config("mxfp8")] * 3
    dims = (((1,), (0,)), ((), ()))
    return jax.jit(lambda x, y: jax.nn.scaled_dot_general(x, y, dims, configs=configs))(a, b)


def worst_row_error(approx: Any, exact: Any) -> float:
    """The largest normwise relative error of one row: each row against its own norm."""
    a, e = np.asarray(approx, np.float64), np.asarray(exact, np.float64)  # (m, n)
    return max(fp8.rel_error(a[i], e[i]) for i in range(e.shape[0]))


def per_tensor_matmul(a: Any, b: Any) -> jax.Array:
    """``a @ b`` with both operands e4m3, per-tensor current scaling, float32 dot."""
    qa, sa = fp8.quantize_current(a)
    qb, sb = fp8.quantize_current(b)
    return fp8.scaled_dot(qa, qb, sa, sb, compute_dtype=jnp.float32)


# ---------------------------------------------------------------------------------------
# Training


@dataclasses.dataclass(frozen=True)
class Curve:
    """The loss per step of one run, and its median wall time per step (first step apart)."""

    name: str
    losses: np.ndarray  # (steps,)
    step_s: float


def train_curve(
    cfg: GPTConfig, steps: int, batch_size: int, seed: int = 0, lr: float = 1e-3, name: str = ""
) -> Curve:
    """Train ``cfg`` for ``steps`` on one device from ``seed`` (same batches for a seed)."""
    mesh = make_mesh((1,), ("data",), devices=jax.devices()[:1])
    tx = train.make_tx(lr)
    step, abstract_state, abstract_batch = train.train_setup(cfg, mesh, "dp", batch_size, tx)
    compiled = step.lower(abstract_state, abstract_batch).compile()
    state = train.init_train_state(cfg, abstract_state, tx, seed=seed)
    tokens, curve, times = data.encode(data.corpus()), [], []
    for batch in data.batches(tokens, batch_size, cfg.seq_len, seed=seed, steps=steps):
        start = time.perf_counter()
        state, loss = compiled(state, jax.device_put(batch, abstract_batch.sharding))
        curve.append(float(loss))  # waits for the step
        times.append(time.perf_counter() - start)
    step_s = float(np.median(times[1:] or times))
    return Curve(name, np.asarray(curve, dtype=np.float64), step_s)


LINEAR_NAMES = ("q", "k", "v", "o", "up", "down")


def layer_amaxes(cfg: GPTConfig, batch_size: int = 4, seed: int = 0) -> list[dict[str, Any]]:
    """Amaxes (and e4m3 / e5m2 scales) each FP8 matmul of a fresh GPT sees in one step.

    One row per ``nnx.Linear`` call, in call order: per block q, k, v, o, up, down, then
    the head. The gradient amax is that of the matmul's output gradient.
    """
    recorder = fp8.AmaxRecorder()
    model = GPT(dataclasses.replace(cfg, dot_general=recorder.dot_general()), rngs=nnx.Rngs(seed))
    graphdef, state = nnx.split(model)
    tokens = data.encode(data.corpus())
    batch = next(iter(data.batches(tokens, batch_size, cfg.seq_len, seed=seed, steps=1)))

    @jax.jit
    def amaxes(state: Any, batch: jax.Array) -> dict[str, list[jax.Array]]:
        recorder.seen.clear()
        jax.grad(lambda s: train.loss_fn(nnx.merge(graphdef, s), batch))(state)
        out: dict[str, list[jax.Array]] = {"lhs": [], "rhs": [], "grad": []}
        for kind, value in recorder.seen:
            out[kind].append(value)
        return out

    seen = jax.tree.map(float, amaxes(state, jnp.asarray(batch)))
    names = [f"{blk}.{n}" for blk in range(cfg.num_layers) for n in LINEAR_NAMES] + ["head"]
    grads = seen["grad"][::-1]  # the backward pass visits the layers in reverse
    rows = []
    for i, name in enumerate(names[: len(seen["lhs"])]):
        lhs, rhs, g = seen["lhs"][i], seen["rhs"][i], grads[i]
        rows.append(
            {
                "layer": name,
                "input amax": lhs,
                "weight amax": rhs,
                "grad amax": g,
                "input scale": float(fp8.scale_from_amax(lhs, fp8.E4M3)),
                "grad scale": float(fp8.scale_from_amax(g, fp8.E5M2)),
            }
        )
    return rows


# ---------------------------------------------------------------------------------------
# GPU mode: measured


def gemm_tflops(n: int, repeats: int = 10) -> dict[str, float]:
    """Measured TFLOP/s of an ``n x n`` bf16 matmul and of the scaled e4m3 pattern here."""
    from labkit.core.timing import timeit

    key = jax.random.key(0)
    a = jax.random.normal(key, (n, n), jnp.bfloat16)  # (n, n)
    qa, sa = fp8.quantize_current(a)
    bf16 = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.bfloat16))
    f8 = jax.jit(lambda x, y, s, t: fp8.scaled_dot(x, y, s, t))
    flops = 2.0 * n**3
    return {
        "bf16": flops / timeit(bf16, a, a, repeats=repeats).median / 1e12,
        "fp8": flops / timeit(f8, qa, qa, sa, sa, repeats=repeats).median / 1e12,
    }


# ---------------------------------------------------------------------------------------
# Checkers


def check_current_scale(answer: Any, amax_value: float = 3.5) -> Feedback:
    """05.1: the e4m3 dequantization scale current scaling gives a tensor of amax 3.5."""
    expected = float(fp8.scale_from_amax(amax_value, fp8.E4M3))
    return check_number(
        "05.1",
        answer,
        expected,
        1e-6,
        f"scale = amax / fp8_max: the tensor's largest magnitude {amax_value} must land on "
        "e4m3's largest finite value (labkit.fp8.fp8_max)",
    )


def check_unsupported_pair(answer: Any) -> Feedback:
    """05.2: an (lhs, rhs) FP8 dtype pair that the H100 FP8 cuBLASLt GEMM does not take."""
    if unanswered(answer):
        return judge("05.2", answer, False, "", "")
    try:
        lhs, rhs = (jnp.dtype(d) for d in answer)
        if lhs not in fp8.FP8_DTYPES or rhs not in fp8.FP8_DTYPES:
            raise TypeError("not two FP8 dtypes")
    except (TypeError, ValueError) as err:
        return Feedback("05.2", False, True, f"give a pair of FP8 dtypes, e.g. (E4M3, E4M3): {err}")
    found = gemms(h100_fp8_gemm(lhs, rhs, n=256).hlo)
    ok = bool(found) and all(g.target != F8_TARGET for g in found)
    return judge(
        "05.2",
        answer,
        ok,
        f"right: {lhs.name} x {rhs.name} compiles to {found[0].target} on {found[0].lhs} "
        "operands: no FP8 tensor cores. (Hopper's FP8 MMA takes e4m3 x e4m3, e4m3 x e5m2 "
        "and e5m2 x e4m3, not e5m2 x e5m2.)",
        f"{lhs.name} x {rhs.name} still becomes {F8_TARGET}; which pair never appeared "
        "in section 3's table as an FP8 call?",
    )


def recovery_step(big_steps: int, history_len: int, big: float = 100.0, small: float = 1.0) -> int:
    """First step whose delayed scale reflects ``small`` again after ``big_steps`` big steps."""
    state = fp8.DelayedScaling.create(history_len)
    target = float(fp8.scale_from_amax(small))
    for t in range(big_steps + history_len + 2):
        if t >= big_steps and np.isclose(float(state.scale), target):
            return t
        state = state.update(jnp.full((4,), big if t < big_steps else small))
    raise RuntimeError("the delayed scale never recovered; check DelayedScaling.update")


def check_recovery(answer: Any, big_steps: int = 5, history_len: int = 16) -> Feedback:
    """05.3: the first step whose delayed scale fits small data again after a burst."""
    expected = recovery_step(big_steps, history_len)
    return check_integer(
        "05.3",
        answer,
        expected,
        f"step {expected}: the last big amax (step {big_steps - 1}) leaves a history of "
        f"{history_len} after {history_len} more updates.",
        "the scale of step t uses the amaxes of steps t-history_len .. t-1; when is the "
        "last big one gone? (try labkit.fp8.DelayedScaling step by step)",
    )


__all__: Sequence[str] = [
    "F8_TARGET",
    "GEMM_VARIANTS",
    "NO_TRITON",
    "Curve",
    "check_current_scale",
    "check_recovery",
    "check_unsupported_pair",
    "gemm_kinds",
    "gemm_tflops",
    "h100_fp8_gemm",
    "h100_mxfp8",
    "layer_amaxes",
    "mxfp8_matmul",
    "per_tensor_matmul",
    "recovery_step",
    "train_curve",
]
