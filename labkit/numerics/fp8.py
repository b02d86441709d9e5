"""FP8 scaling and an FP8 ``dot_general``: quantize, dequantize, current and delayed scaling.

A scaled FP8 tensor is a pair ``(data, scale)`` with ``x ≈ data.astype(f32) * scale``: the
*dequantization* multiplier, the form XLA's GPU GEMM rewriter looks for (``convert(f8) *
scalar``). A scale maps the tensor's largest magnitude (its *amax*) onto the format's
largest finite value, so small data use the whole FP8 range and outliers do not overflow.

- :func:`fp8_max`, :func:`amax`, :func:`scale_from_amax`;
- :func:`quantize` (saturating or raw cast), :func:`dequantize`, :func:`qdq`;
- current scaling (:func:`quantize_current`: the scale from this tensor's amax) and delayed
  scaling (:class:`DelayedScaling`, :func:`quantize_delayed`: the scale from a history of
  past amaxes, as NVIDIA Transformer Engine's recipe does, updated after use);
- :data:`fp8_dot_general`: a drop-in ``jax.lax.dot_general`` for ``nnx.Linear`` /
  ``GPTConfig(dot_general=...)``: e4m3 operands forward, e5m2 gradients backward
  (``jax.custom_vjp``), current scaling, and every GEMM a ``dot_general`` on FP8 arrays, so
  the program XLA builds for an H100 has FP8 GEMMs (it also runs on a CPU, emulated);
- :data:`qdq_dot_general`: the same rounding as fake quantization (FP8 and back to float32,
  then a plain dot): the trap, because XLA:GPU folds the round trip away;
- :func:`scaled_dot`: the dequantize -> dot pattern from already-quantized operands;
- :func:`fp8_gemms`, :func:`gemm_passes`: the FP8 GEMMs of a compiled program, by pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.typing import ArrayLike, DTypeLike

from labkit.xla.gemms import Gemm, gemms

E4M3 = jnp.float8_e4m3fn  # forward: activations and weights (more precision, max 448)
E5M2 = jnp.float8_e5m2  # backward: gradients (more range, max 57344)
FP8_DTYPES = (jnp.dtype(E4M3), jnp.dtype(E5M2))


def _fp8(dtype: DTypeLike) -> np.dtype:
    dt = jnp.dtype(dtype)
    if dt not in FP8_DTYPES:
        raise ValueError(f"expected float8_e4m3fn or float8_e5m2, got {dt}")
    return dt


def fp8_max(dtype: DTypeLike = E4M3) -> float:
    """Largest finite value of an FP8 dtype (448 for e4m3fn, 57344 for e5m2)."""
    return float(ml_dtypes.finfo(_fp8(dtype)).max)


def amax(x: ArrayLike) -> jax.Array:
    """``max |x|`` as a float32 scalar (NaN if ``x`` has a NaN; 0 for an all-zero tensor)."""
    return jnp.max(jnp.abs(jnp.asarray(x).astype(jnp.float32)))


def scale_from_amax(amax_value: ArrayLike, dtype: DTypeLike = E4M3, margin: int = 0) -> jax.Array:
    """The dequantization scale that maps ``amax_value`` to ``fp8_max(dtype) / 2**margin``.

    An amax of zero, a negative one, NaN or inf gives scale 1.0 (nothing to learn from it:
    an all-zero tensor quantizes exactly with any scale, and a NaN must not poison it).
    """
    a = jnp.asarray(amax_value, jnp.float32)
    ok = jnp.isfinite(a) & (a > 0)
    return jnp.where(ok, a * 2.0**margin / fp8_max(dtype), 1.0).astype(jnp.float32)


def _safe_scale(scale: ArrayLike) -> jax.Array:
    s = jnp.asarray(scale, jnp.float32)
    return jnp.where(jnp.isfinite(s) & (s > 0), s, 1.0)  # a zero scale would divide by 0


def quantize(
    x: ArrayLike, scale: ArrayLike = 1.0, dtype: DTypeLike = E4M3, saturate: bool = True
) -> jax.Array:
    """``x / scale`` cast to FP8 ``dtype``; ``saturate`` clips to ``±fp8_max`` first.

    Without saturation, overflow follows the cast: e4m3fn has no inf and gives NaN, e5m2
    gives ±inf. NaN stays NaN either way. A scale that is zero, negative or not finite is
    replaced by 1.0 (a zero scale would turn every value into inf or NaN).
    """
    dt = _fp8(dtype)
    y = jnp.asarray(x).astype(jnp.float32) / _safe_scale(scale)
    if saturate:
        y = jnp.clip(y, -fp8_max(dt), fp8_max(dt))  # NaN passes through clip
    return y.astype(dt)


def dequantize(
    data: ArrayLike, scale: ArrayLike = 1.0, dtype: DTypeLike = jnp.float32
) -> jax.Array:
    """``data.astype(dtype) * scale``: the form XLA's GPU GEMM rewriter matches."""
    return jnp.asarray(data).astype(dtype) * _safe_scale(scale).astype(dtype)


def quantize_current(
    x: ArrayLike, dtype: DTypeLike = E4M3, margin: int = 0
) -> tuple[jax.Array, jax.Array]:
    """Per-tensor *current* scaling: ``(data, scale)`` with the scale from ``amax(x)``."""
    scale = scale_from_amax(amax(x), dtype, margin)
    return quantize(x, scale, dtype), scale


def qdq(x: ArrayLike, dtype: DTypeLike = E4M3, scaling: str = "current") -> jax.Array:
    """``x`` quantized to FP8 and back, in ``x``'s dtype: the FP8 rounding error alone.

    ``scaling``: ``"current"`` (per-tensor scale from ``amax(x)``), ``"none"`` (scale 1,
    saturating) or ``"raw"`` (scale 1, plain cast: overflow gives NaN or inf).
    """
    x = jnp.asarray(x)
    if scaling == "current":
        data, scale = quantize_current(x, dtype)
    elif scaling in ("none", "raw"):
        data, scale = quantize(x, 1.0, dtype, saturate=scaling == "none"), jnp.float32(1.0)
    else:
        raise ValueError(f"scaling must be 'current', 'none' or 'raw', got {scaling!r}")
    return dequantize(data, scale, jnp.float32).astype(x.dtype)


# ---------------------------------------------------------------------------------------
# Delayed scaling


@dataclasses.dataclass(frozen=True)
class DelayedScaling:
    """State of delayed scaling for one tensor: the last ``len(history)`` amaxes, newest first.

    The scale used for step ``t`` comes from ``max(history)`` of steps before ``t``, so the
    scale needs no extra pass over the data (the reason for the recipe: NVIDIA Transformer
    Engine, ``DelayedScaling``, ``amax_compute_algo="max"``). A tensor that grows past the
    history's amax saturates until the history catches up.
    """

    history: jax.Array  # (history_len,) float32, newest first
    dtype: DTypeLike = E4M3
    margin: int = 0

    @classmethod
    def create(
        cls, history_len: int = 16, dtype: DTypeLike = E4M3, margin: int = 0
    ) -> DelayedScaling:
        """An empty history (all zeros: the first scale is 1.0)."""
        if history_len < 1:
            raise ValueError(f"history_len must be >= 1, got {history_len}")
        return cls(jnp.zeros((history_len,), jnp.float32), _fp8(dtype), margin)

    @property
    def scale(self) -> jax.Array:
        """The scale for the next tensor, from the largest amax in the history."""
        return scale_from_amax(jnp.max(self.history), self.dtype, self.margin)

    def update(self, x: ArrayLike) -> DelayedScaling:
        """The state after seeing ``x``: its amax pushed to the front, the oldest dropped.

        A non-finite amax (NaN or inf in ``x``) is recorded as 0, so it does not stick.
        """
        a = amax(x)
        a = jnp.where(jnp.isfinite(a), a, 0.0)
        history = jnp.concatenate([a[None], self.history[:-1]])  # (history_len,)
        return dataclasses.replace(self, history=history)


def quantize_delayed(
    x: ArrayLike, state: DelayedScaling
) -> tuple[jax.Array, jax.Array, DelayedScaling]:
    """``(data, scale, new_state)``: ``x`` quantized with the history's scale, then recorded."""
    scale = state.scale
    return quantize(x, scale, state.dtype), scale, state.update(x)


def delayed_errors(
    tensors: Sequence[ArrayLike], history_len: int = 16, dtype: DTypeLike = E4M3
) -> list[float]:
    """Normwise relative error of each tensor of a sequence under delayed scaling."""
    state, out = DelayedScaling.create(history_len, dtype), []
    for x in tensors:
        data, scale, state = quantize_delayed(x, state)
        out.append(rel_error(dequantize(data, scale), x))
    return out


def rel_error(approx: ArrayLike, exact: ArrayLike) -> float:
    """``||approx - exact|| / ||exact||`` in float64 (inf if ``approx`` has NaN or inf)."""
    a, e = np.asarray(approx, np.float64), np.asarray(exact, np.float64)
    if not np.all(np.isfinite(a)):
        return float("inf")
    norm = float(np.linalg.norm(e))
    diff = float(np.linalg.norm(a - e))
    return diff / norm if norm else (0.0 if diff == 0 else float("inf"))


# ---------------------------------------------------------------------------------------
# FP8 matmuls


def scaled_dot(
    a: jax.Array,
    b: jax.Array,
    a_scale: jax.Array,
    b_scale: jax.Array,
    compute_dtype: DTypeLike = jnp.bfloat16,
    out_dtype: DTypeLike | None = None,
) -> jax.Array:
    """``(a * a_scale) @ (b * b_scale)`` from FP8 ``a`` ``(m, k)`` and ``b`` ``(k, n)``.

    Written as XLA:GPU's FP8 GEMM pattern: convert each FP8 operand to ``compute_dtype``,
    multiply by its scalar scale, dot. ``out_dtype`` FP8 adds the output quantization
    (saturating, scale 1).
    """
    x = dequantize(a, a_scale, compute_dtype)  # (m, k)
    y = dequantize(b, b_scale, compute_dtype)  # (k, n)
    out = jnp.dot(x, y, preferred_element_type=compute_dtype)  # (m, n)
    if out_dtype is not None and jnp.dtype(out_dtype) in FP8_DTYPES:
        return quantize(out, 1.0, out_dtype)
    return out if out_dtype is None else out.astype(out_dtype)


def _qdq_current(x: jax.Array, dtype: DTypeLike) -> jax.Array:
    data, scale = quantize_current(jax.lax.stop_gradient(x), dtype)
    return dequantize(data, scale, jnp.float32).astype(x.dtype)


type Observer = Callable[[str, jax.Array], None]


@dataclasses.dataclass(frozen=True)
class _DotCall:
    """What one call of a ``dot_general`` was given."""

    lhs: jax.Array
    rhs: jax.Array
    dimension_numbers: jax.lax.DotDimensionNumbers
    precision: jax.lax.PrecisionLike
    preferred_element_type: DTypeLike | None
    kwargs: dict[str, Any]

    @property
    def out_dtype(self) -> np.dtype:
        """The dtype the caller expects: its preferred one, else the operands' common one."""
        if self.preferred_element_type is not None:
            return jnp.dtype(self.preferred_element_type)
        return jnp.result_type(self.lhs, self.rhs)

    def dot(self, x: jax.Array, y: jax.Array, **override: Any) -> jax.Array:
        """``jax.lax.dot_general(x, y)`` with this call's arguments, ``override`` replacing some."""
        given = {"precision": self.precision, "preferred_element_type": self.preferred_element_type}
        return jax.lax.dot_general(x, y, self.dimension_numbers, **given | self.kwargs | override)


# A custom VJP's two rules: forward (x, y) -> (value, residuals); backward (residuals, g) ->
# (dx, dy).
type _Rules = tuple[
    Callable[[jax.Array, jax.Array], tuple[jax.Array, Any]],
    Callable[[Any, jax.Array], tuple[jax.Array, jax.Array]],
]


def _dot_general_with_vjp(
    rules: Callable[[_DotCall], _Rules], observer: Observer | None
) -> Callable[..., jax.Array]:
    """A ``jax.lax.dot_general`` whose value and gradients are ``rules(call)`` (a
    ``jax.custom_vjp``); it reports the ``"lhs"``, ``"rhs"`` and ``"grad"`` amaxes to
    ``observer``."""

    def dot_general(
        lhs: jax.Array,
        rhs: jax.Array,
        dimension_numbers: jax.lax.DotDimensionNumbers,
        precision: jax.lax.PrecisionLike = None,
        preferred_element_type: DTypeLike | None = None,
        **kwargs: Any,
    ) -> jax.Array:
        call = _DotCall(lhs, rhs, dimension_numbers, precision, preferred_element_type, kwargs)
        forward, backward = rules(call)

        def fwd(x: jax.Array, y: jax.Array) -> tuple[jax.Array, Any]:
            if observer is not None:
                observer("lhs", amax(x))
                observer("rhs", amax(y))
            return forward(x, y)

        def bwd(res: Any, g: jax.Array) -> tuple[jax.Array, jax.Array]:
            if observer is not None:
                observer("grad", amax(g))
            return backward(res, g)

        @jax.custom_vjp
        def dot(x: jax.Array, y: jax.Array) -> jax.Array:
            return fwd(x, y)[0]

        dot.defvjp(fwd, bwd)
        return dot(lhs, rhs)

    return dot_general


def make_fp8_dot_general(
    fwd_dtype: DTypeLike = E4M3,
    bwd_dtype: DTypeLike = E5M2,
    observer: Observer | None = None,
) -> Callable[..., jax.Array]:
    """A ``jax.lax.dot_general`` whose GEMMs take FP8 operands, forward and backward.

    Forward: both operands quantized to ``fwd_dtype`` with current scaling, one
    ``dot_general`` on the FP8 arrays accumulating in float32, the product of the two scales
    applied to its output. Backward (``jax.custom_vjp``): the incoming gradient quantized to
    ``bwd_dtype``, then the two transposed dots (flax's
    ``flax.linen.fp8_ops.dot_general_transpose_lhs`` / ``_rhs``) on FP8 operands. The FP8
    arrays reach the dots as they are, so XLA cannot fold the rounding away (compare
    :func:`make_qdq_dot_general`). ``observer(kind, amax)`` is called with ``"lhs"``,
    ``"rhs"`` and ``"grad"`` amaxes (tracers under ``jit``: see :class:`AmaxRecorder`).
    """
    from flax.linen import fp8_ops

    _fp8(fwd_dtype), _fp8(bwd_dtype)

    def rules(call: _DotCall) -> _Rules:
        def fwd(x: jax.Array, y: jax.Array) -> tuple[jax.Array, tuple[jax.Array, ...]]:
            qx, sx = quantize_current(jax.lax.stop_gradient(x), fwd_dtype)
            qy, sy = quantize_current(jax.lax.stop_gradient(y), fwd_dtype)
            out = call.dot(qx, qy, precision=None, preferred_element_type=jnp.float32)
            return (out * (sx * sy)).astype(call.out_dtype), (qx, sx, qy, sy)

        def bwd(res: tuple[jax.Array, ...], g: jax.Array) -> tuple[jax.Array, jax.Array]:
            qx, sx, qy, sy = res
            qg, sg = quantize_current(g, bwd_dtype)
            grads = {"precision": None, "preferred_element_type": jnp.float32}
            dims = call.dimension_numbers
            dx = fp8_ops.dot_general_transpose_lhs(qg, qx, qy, dimension_numbers=dims, **grads)
            dy = fp8_ops.dot_general_transpose_rhs(qg, qx, qy, dimension_numbers=dims, **grads)
            # dx has lhs's shape, dy rhs's
            return (dx * (sg * sy)).astype(call.lhs.dtype), (dy * (sg * sx)).astype(call.rhs.dtype)

        return fwd, bwd

    return _dot_general_with_vjp(rules, observer)


def make_qdq_dot_general(
    fwd_dtype: DTypeLike = E4M3,
    bwd_dtype: DTypeLike = E5M2,
    observer: Observer | None = None,
) -> Callable[..., jax.Array]:
    """FP8 *fake quantization*: round to FP8 and back to float32, then a plain ``dot_general``.

    The numerics of FP8 on any backend, but not an FP8 GEMM: compiled for a GPU, XLA's
    ``simplify-fp-conversions`` pass turns the ``f32 -> f8 -> f32`` round trip into nothing
    (``xla_allow_excess_precision``, true by default), so the GEMM runs in the compute dtype and
    the FP8 rounding is gone too. Kept to show that trap; train with :data:`fp8_dot_general`.
    """
    _fp8(fwd_dtype), _fp8(bwd_dtype)

    def rules(call: _DotCall) -> _Rules:
        def fwd(x: jax.Array, y: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
            qx, qy = _qdq_current(x, fwd_dtype), _qdq_current(y, fwd_dtype)
            return call.dot(qx, qy), (qx, qy)

        def bwd(res: tuple[jax.Array, jax.Array], g: jax.Array) -> tuple[jax.Array, jax.Array]:
            _, vjp = jax.vjp(call.dot, *res)
            return vjp(_qdq_current(g, bwd_dtype))

        return fwd, bwd

    return _dot_general_with_vjp(rules, observer)


fp8_dot_general = make_fp8_dot_general()
"""The default FP8 ``dot_general``: e4m3 forward, e5m2 gradients, current scaling, FP8 GEMMs."""

qdq_dot_general = make_qdq_dot_general()
"""Fake-quantized FP8 (same rounding, no FP8 GEMM on a GPU): the trap beside the real one."""


@dataclasses.dataclass
class AmaxRecorder:
    """Collects ``(kind, amax)`` pairs an FP8 ``dot_general`` reports, in call order.

    Under ``jit`` the amaxes are tracers: return them from the jitted function (see
    ``labkit.lessons.n05_fp8.train_curve``); in eager code they are concrete arrays.
    """

    seen: list[tuple[str, jax.Array]] = dataclasses.field(default_factory=list)

    def __call__(self, kind: str, value: jax.Array) -> None:
        """Record one amax."""
        self.seen.append((kind, value))

    def dot_general(self) -> Callable[..., jax.Array]:
        """An FP8 ``dot_general`` that reports to this recorder."""
        return make_fp8_dot_general(observer=self)


# ---------------------------------------------------------------------------------------
# FP8 GEMMs in a compiled program


def fp8_gemms(hlo: str) -> list[Gemm]:
    """The GEMMs of a compiled module whose two operands are FP8 (any kernel)."""
    return [g for g in gemms(hlo) if g.lhs.startswith("f8") and g.rhs.startswith("f8")]


def gemm_passes(hlo: str) -> dict[str, int]:
    """FP8 GEMMs by pass, read from their operand types: e4m3 x e4m3 is a forward GEMM, a
    GEMM with an e5m2 operand (the gradient) a backward one; ``"not FP8"`` counts the rest.
    """
    found = gemms(hlo)
    f8 = fp8_gemms(hlo)
    backward = sum("f8e5m2" in (g.lhs, g.rhs) for g in f8)
    return {"forward": len(f8) - backward, "backward": backward, "not FP8": len(found) - len(f8)}


# ---------------------------------------------------------------------------------------
# cuBLASLt's scaling modes per architecture, and what XLA emits for them


@dataclasses.dataclass(frozen=True)
class ScaleMode:
    """One ``cublasLtMatmulMatrixScale_t`` mode: where its scales apply, on which GPUs."""

    mode: str  # the enum value, without the CUBLASLT_MATMUL_MATRIX_SCALE_ prefix
    granularity: str
    scale_type: str
    gpus: str
    xla: str  # what this jaxlib's XLA emits for such scales


SCALE_MODES_SOURCE = (
    "NVIDIA cuBLAS documentation, cuBLASLt API: cublasLtMatmulMatrixScale_t and its table of "
    "scaling modes per compute capability (https://docs.nvidia.com/cuda/cublas/#id96), as an "
    "NVIDIA cuBLAS engineer quotes it in NVIDIA/CUDALibrarySamples issue 270 (2025-07-10): "
    "OUTER_VEC_32F, VEC128_32F and BLK128x128_32F 'are currently only supported on SM90', "
    "'SM100+ supports VEC32_UE8M0'; NVIDIA technical blog 'Boosting Matrix Multiplication Speed "
    "and Flexibility with NVIDIA cuBLAS 12.9' (2025): the Hopper modes are new in cuBLAS 12.9, "
    "earlier versions had tensor-wide scaling only; 1D block-scaled FP8 and FP4 on Blackwell"
)

SCALE_MODES: tuple[ScaleMode, ...] = (
    ScaleMode(
        "SCALAR_32F",
        "one scale per tensor",
        "float32",
        "Ada, Hopper, Blackwell",
        "yes: __cublas$lt$matmul$f8 with scalar scales (cuBLAS GEMMs)",
    ),
    ScaleMode(
        "OUTER_VEC_32F",
        "one per row of A, one per column of B",
        "float32",
        "Hopper (sm_90) only, cuBLAS >= 12.9",
        "no: a per-row scale leaves an f32 cuBLAS GEMM",
    ),
    ScaleMode(
        "VEC128_32F",
        "one per 128 elements along K (1 x 128)",
        "float32",
        "Hopper (sm_90) only, cuBLAS >= 12.9",
        "no cuBLASLt call with it seen here",
    ),
    ScaleMode(
        "BLK128x128_32F",
        "one per 128 x 128 block",
        "float32",
        "Hopper (sm_90) only, cuBLAS >= 12.9",
        "no cuBLASLt call with it seen here",
    ),
    ScaleMode(
        "VEC32_UE8M0",
        "one per 32 elements along K (MXFP8)",
        "e8m0 (a power of two)",
        "Blackwell (sm_100)",
        "not through cuBLAS: lax.scaled_dot becomes a Triton kernel (tcgen05 block_scale)",
    ),
    ScaleMode(
        "VEC16_UE4M3",
        "one per 16 elements along K (NVFP4)",
        "e4m3, unsigned",
        "Blackwell (sm_100)",
        "not tried here",
    ),
)
"""The scaling modes of ``cublasLtMatmul`` for narrow types (see :data:`SCALE_MODES_SOURCE`)."""
