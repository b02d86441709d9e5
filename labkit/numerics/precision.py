"""Number formats, rounding error and dtype policies: the numerics of low-precision matmuls.

- formats: :class:`FloatFormat` (from ``ml_dtypes.finfo``, or from the bit layout for TF32,
  a tensor-core input format), :data:`FORMATS`, :func:`spacing`, :func:`grid`, :func:`round_to`;
- errors against a float64 reference: :func:`errors` -> :class:`ErrorStats` (NaN, inf,
  zero and subnormals defined), :func:`matmul_errors`;
- compiled HLO: :func:`gemms`, :func:`convert_counts` (from :mod:`labkit.xla.gemms`);
- dtype policies for the GPT: :class:`Policy` (params / compute / output), :data:`POLICIES`.

FP8 scaling and the FP8 ``dot_general`` live in :mod:`labkit.numerics.fp8`; the FP8 formats are in
:data:`FORMATS`, ``round_to`` and ``errors`` accept them, and a :class:`Policy` carries an
optional ``dot_general``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NotRequired, TypedDict

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.typing import ArrayLike, DTypeLike

from labkit.core.types import PyTree

# The HLO readers moved to labkit.xla.gemms; these names stay importable from here.
from labkit.xla.gemms import Gemm as Gemm
from labkit.xla.gemms import convert_counts as convert_counts
from labkit.xla.gemms import gemms as gemms

# ---------------------------------------------------------------------------------------
# Formats


@dataclasses.dataclass(frozen=True)
class FloatFormat:
    """One binary floating-point format: bit layout and the numbers it can hold.

    ``eps`` is the gap between 1 and the next larger value (2^-mantissa_bits); a value
    rounded to nearest is off by at most ``eps / 2`` relative (the unit roundoff) while it
    stays in the normal range. ``dtype`` is the JAX storage dtype name, or None (TF32).
    """

    name: str
    bits: int
    exponent_bits: int
    mantissa_bits: int  # stored fraction bits, without the implicit leading 1
    max: float
    smallest_normal: float
    smallest_subnormal: float
    eps: float
    has_inf: bool
    dtype: str | None
    note: str = ""

    @property
    def unit_roundoff(self) -> float:
        """Largest relative error of round-to-nearest in the normal range (``eps / 2``)."""
        return self.eps / 2

    @property
    def decimal_digits(self) -> float:
        """About how many significant decimal digits the format keeps."""
        return float(np.log10(2.0) * (self.mantissa_bits + 1))

    def row(self) -> dict[str, str | int | bool]:
        """The format as a table row (numbers printed with 4 significant digits)."""
        return {
            "format": self.name,
            "bits": self.bits,
            "exponent": self.exponent_bits,
            "mantissa": self.mantissa_bits,
            "max": f"{self.max:.4g}",
            "smallest normal": f"{self.smallest_normal:.4g}",
            "eps": f"{self.eps:.4g}",
            "inf": self.has_inf,
            "storage dtype": self.dtype or "none",
        }


def from_dtype(dtype: DTypeLike, note: str = "") -> FloatFormat:
    """The :class:`FloatFormat` of a JAX / ml_dtypes floating dtype, read from ``finfo``."""
    dt = jnp.dtype(dtype)
    if not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(f"{dt} is not a floating dtype; pass e.g. jnp.bfloat16")
    fi = ml_dtypes.finfo(dt)
    has_inf = bool(np.isinf(np.array(np.inf).astype(dt)))  # e4m3fn has none: inf -> NaN
    return FloatFormat(
        dt.name,
        int(fi.bits),
        int(fi.nexp),
        int(fi.nmant),
        float(fi.max),
        float(fi.smallest_normal),
        float(fi.smallest_subnormal),
        float(fi.eps),
        has_inf,
        dt.name,
        note,
    )


def ieee_like(name: str, exponent_bits: int, mantissa_bits: int, note: str = "") -> FloatFormat:
    """A format with IEEE-754 rules (top exponent for inf/NaN) from its bit layout alone."""
    if exponent_bits < 2 or mantissa_bits < 1:
        raise ValueError(f"need exponent >= 2, mantissa >= 1 bits: {exponent_bits},{mantissa_bits}")
    bias = 2 ** (exponent_bits - 1) - 1
    return FloatFormat(
        name,
        1 + exponent_bits + mantissa_bits,
        exponent_bits,
        mantissa_bits,
        (2 - 2.0**-mantissa_bits) * 2.0**bias,
        2.0 ** (1 - bias),
        2.0 ** (1 - bias - mantissa_bits),
        2.0**-mantissa_bits,
        True,
        None,
        note,
    )


TF32_NOTE = (
    "NVIDIA TensorFloat-32: float32's 8-bit exponent with a 10-bit mantissa; an input "
    "format of Ampere and Hopper tensor cores (NVIDIA A100 architecture whitepaper, 2020), "
    "not a storage dtype"
)
FORMATS: dict[str, FloatFormat] = {
    f.name: f
    for f in (
        from_dtype(jnp.float32, "IEEE 754 single precision"),
        ieee_like("tensorfloat32", 8, 10, TF32_NOTE),
        from_dtype(jnp.bfloat16, "Google Brain float: float32's exponent, 7-bit mantissa"),
        from_dtype(jnp.float16, "IEEE 754 half precision"),
        from_dtype(jnp.float8_e4m3fn, "FP8 E4M3 (OCP FP8 spec): no inf, overflow is NaN"),
        from_dtype(jnp.float8_e5m2, "FP8 E5M2 (OCP FP8 spec)"),
    )
}


type FormatLike = FloatFormat | DTypeLike
"""A format: a :class:`FloatFormat`, its name (``"bfloat16"``, ``"tf32"``) or a float dtype."""


def get_format(name: FormatLike) -> FloatFormat:
    """A format by name (``"bfloat16"``, ``"tensorfloat32"``/``"tf32"``) or by dtype."""
    if isinstance(name, FloatFormat):
        return name
    key = "tensorfloat32" if name in ("tf32", "TF32") else name
    if isinstance(key, str) and key in FORMATS:
        return FORMATS[key]
    try:
        return FORMATS.get(jnp.dtype(key).name) or from_dtype(key)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"unknown format {name!r}; use one of {sorted(FORMATS)} or a floating dtype"
        ) from err


def spacing(x: ArrayLike, fmt: FormatLike) -> np.ndarray:
    """The gap (one ulp) between representable values of ``fmt`` at ``|x|``, as float64.

    Normal range: ``2^(floor(log2|x|) - mantissa_bits)``; below the smallest normal (zero
    and subnormals included) the gap is the smallest subnormal. NaN and inf give NaN.
    """
    f = get_format(fmt)
    mag = np.abs(np.asarray(x, dtype=np.float64))
    _, exp = np.frexp(np.where(np.isfinite(mag) & (mag > 0), mag, 1.0))  # mag = m * 2^exp
    ulp = np.ldexp(1.0, exp - 1 - f.mantissa_bits)
    ulp = np.where(mag < f.smallest_normal, f.smallest_subnormal, ulp)
    return np.where(np.isfinite(mag), ulp, np.nan)


def grid(fmt: FormatLike, lo: float, hi: float, max_points: int = 100_000) -> np.ndarray:
    """Every positive value of ``fmt`` in ``[lo, hi]``, ascending (float64)."""
    f = get_format(fmt)
    if not 0 <= lo <= hi:
        raise ValueError(f"need 0 <= lo <= hi, got lo={lo}, hi={hi}")
    steps = 2**f.mantissa_bits
    if (hi > 0) * steps * (
        np.log2(max(hi, f.smallest_normal) / max(lo, f.smallest_normal)) + 1
    ) > max_points:
        raise ValueError(
            f"{f.name} has more than {max_points} values in [{lo}, {hi}]: narrow the range "
            "or use spacing() for a format with this many mantissa bits"
        )
    values = [f.smallest_subnormal * np.arange(1, steps)]  # subnormals
    e_lo = int(np.floor(np.log2(max(lo, f.smallest_normal))))
    e_hi = int(np.floor(np.log2(min(max(hi, f.smallest_normal), f.max))))
    for e in range(e_lo, e_hi + 1):
        values.append(2.0**e * (1 + np.arange(steps) / steps))
    out = np.concatenate(values)
    return out[(out >= lo) & (out <= min(hi, f.max))]


def round_mantissa(x: ArrayLike, mantissa_bits: int) -> np.ndarray:
    """``x`` rounded to nearest-even with ``mantissa_bits`` (< 23) fraction bits, as float32.

    What feeding float32 to a TF32 tensor core does to its inputs (``mantissa_bits=10``).
    float64 input is rounded once, from its own bits. NaN and inf pass through; values past
    float32's range become inf.
    """
    if not 0 < mantissa_bits < 23:
        raise ValueError(f"mantissa_bits must be 1..22, got {mantissa_bits}")
    arr = np.asarray(x)
    wide = arr.dtype == np.float64
    arr = arr if wide else arr.astype(np.float32)
    bits = arr.view(np.uint64 if wide else np.uint32).astype(np.uint64)
    shift = np.uint64((52 if wide else 23) - mantissa_bits)
    one = np.uint64(1)
    half = (one << (shift - one)) - one + ((bits >> shift) & one)  # ties to even
    rounded = (
        ((bits + half) >> shift << shift).view(np.float64)
        if wide
        else (((bits + half) >> shift << shift).astype(np.uint32).view(np.float32))
    )
    with np.errstate(over="ignore"):
        out = np.asarray(rounded).astype(np.float32)
    return np.where(np.isfinite(arr), out, arr.astype(np.float32))


def round_to(x: ArrayLike, fmt: FormatLike) -> np.ndarray:
    """``x`` rounded to ``fmt`` and returned as float32 (TF32 emulated by bit rounding).

    float32 input is rounded once. float64 input goes straight to the format, but
    ml_dtypes' float64 -> bfloat16 cast passes through float32 (two roundings: up to a
    hair over half an ulp); start from float32 data for exact bounds.
    """
    f = get_format(fmt)
    if f.dtype is None:
        return round_mantissa(x, f.mantissa_bits)
    arr = np.asarray(x)
    arr = arr if arr.dtype == np.float64 else arr.astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        return arr.astype(f.dtype).astype(np.float32)  # one rounding, straight to the format


# ---------------------------------------------------------------------------------------
# Error metrics


@dataclasses.dataclass(frozen=True)
class ErrorStats:
    """Errors of ``actual`` against a float64 ``reference``, element by element.

    ``max_rel``/``mean_rel``: ``|a - r| / max(|r|, smallest_normal)`` (the floor keeps zero
    and subnormal references finite: there the error counts absolutely, in units of the
    smallest normal). ``norm_rel``: ``||a - r|| / ||r||`` (2-norms), the usual figure for a
    matmul, whose near-zero entries make elementwise errors meaningless.
    ``max_ulp``: ``|a - r|`` in ulps of ``fmt`` at ``r`` (<= 0.5 for one correct rounding).
    Special values: NaN matching NaN, or inf matching an inf of the same sign, is an exact
    match (error 0); any other pair with a NaN or inf is a ``mismatch``, and makes ``max_rel``
    and ``max_ulp`` inf. Means and norms are over the finite pairs only.
    """

    count: int
    mismatches: int
    max_abs: float
    max_rel: float
    mean_rel: float
    norm_rel: float
    max_ulp: float
    fmt: str

    def row(self, name: str = "") -> dict[str, str | int]:
        """The statistics as a table row, numbers to 3 significant digits."""
        return {
            "case": name,
            "norm rel": f"{self.norm_rel:.3g}",
            "max rel": f"{self.max_rel:.3g}",
            "mean rel": f"{self.mean_rel:.3g}",
            "max ulp": f"{self.max_ulp:.3g}",
            "mismatches": self.mismatches,
        }


def _float64(x: ArrayLike) -> np.ndarray:
    return np.asarray(np.asarray(x).astype(np.float64))


def errors(actual: ArrayLike, reference: ArrayLike, fmt: FormatLike | None = None) -> ErrorStats:
    """:class:`ErrorStats` of ``actual`` against ``reference`` (same shape).

    ``fmt`` sets the ulp and the floor of relative errors; default: ``actual``'s dtype
    (float32 for non-float input).
    """
    if fmt is None:
        dt = np.asarray(actual).dtype
        fmt = dt if jnp.issubdtype(dt, jnp.floating) and dt != np.float64 else "float32"
    f = get_format(fmt)
    a, r = _float64(actual), _float64(reference)
    if a.shape != r.shape:
        raise ValueError(f"actual {a.shape} and reference {r.shape} differ in shape")
    finite = np.isfinite(a) & np.isfinite(r)
    same_special = (np.isnan(a) & np.isnan(r)) | (np.isinf(a) & (a == r))
    mismatches = int(np.sum(~finite & ~same_special))
    diff = np.abs(a[finite] - r[finite])
    ref = r[finite]
    rel = diff / np.maximum(np.abs(ref), f.smallest_normal)
    ulp = diff / spacing(ref, f) if ref.size else diff
    bad = np.inf if mismatches else 0.0
    ref_norm, diff_norm = float(np.linalg.norm(ref)), float(np.linalg.norm(diff))
    norm_rel = diff_norm / ref_norm if ref_norm else (0.0 if diff_norm == 0 else np.inf)
    return ErrorStats(
        count=int(a.size),
        mismatches=mismatches,
        max_abs=max(float(diff.max(initial=0.0)), bad),
        max_rel=max(float(rel.max(initial=0.0)), bad),
        mean_rel=float(rel.mean()) if rel.size else float("nan"),
        norm_rel=norm_rel,
        max_ulp=max(float(ulp.max(initial=0.0)), bad),
        fmt=f.name,
    )


def matmul_errors(
    a: ArrayLike,
    b: ArrayLike,
    precision: jax.lax.PrecisionLike = None,
    input_format: FormatLike | None = None,
    preferred_element_type: DTypeLike | None = None,
) -> ErrorStats:
    """Errors of ``jnp.matmul(a, b)`` on the default device against a float64 matmul.

    ``input_format`` rounds both inputs first (a storage dtype is cast to; ``tensorfloat32``
    is emulated in float32); the float64 reference uses the unrounded inputs, so the figure
    is the whole cost of the format. Errors are measured in float32 units.
    """
    a32, b32 = np.asarray(a, np.float32), np.asarray(b, np.float32)  # (m, k), (k, n)
    reference = a32.astype(np.float64) @ b32.astype(np.float64)  # (m, n)
    x, y = jnp.asarray(a32), jnp.asarray(b32)
    if input_format is not None:
        f = get_format(input_format)
        if f.dtype is None:
            x, y = jnp.asarray(round_to(a32, f)), jnp.asarray(round_to(b32, f))
        else:
            x, y = x.astype(f.dtype), y.astype(f.dtype)

    def mm(p: jax.Array, q: jax.Array) -> jax.Array:
        return jnp.matmul(p, q, precision=precision, preferred_element_type=preferred_element_type)

    out = np.asarray(jax.jit(mm)(x, y)).astype(np.float64)  # (m, n)
    return errors(out, reference, "float32")


# ---------------------------------------------------------------------------------------
# Dtype policies


class ConfigOverrides(TypedDict):
    """The fields of a GPT config that a :class:`Policy` sets (``GPTConfig.preset(**...)``)."""

    param_dtype: np.dtype
    dtype: np.dtype
    dot_general: NotRequired[Callable[..., jax.Array]]


@dataclasses.dataclass(frozen=True)
class Policy:
    """Which dtype each kind of tensor has: stored ``params``, ``compute`` (activations and
    matmul inputs) and ``output`` (logits into the loss). ``dot_general`` optionally replaces
    every matmul of the GPT (the FP8 hook of ``GPTConfig``)."""

    name: str
    params: str
    compute: str
    output: str
    dot_general: Callable[..., jax.Array] | None = None

    def __post_init__(self) -> None:
        for field in ("params", "compute", "output"):
            dt = jnp.dtype(getattr(self, field))
            if not jnp.issubdtype(dt, jnp.floating):
                raise ValueError(f"Policy.{field} must be a float dtype, got {dt}")
            object.__setattr__(self, field, dt.name)

    def config_overrides(self) -> ConfigOverrides:
        """Keyword overrides for ``GPTConfig.preset(name, **overrides)``."""
        out: ConfigOverrides = {
            "param_dtype": jnp.dtype(self.params),
            "dtype": jnp.dtype(self.compute),
        }
        if self.dot_general is not None:
            out["dot_general"] = self.dot_general
        return out

    def _cast(self, tree: PyTree, dtype: str) -> PyTree:
        def one(x: PyTree) -> PyTree:
            floating = hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)
            return x.astype(dtype) if floating else x

        return jax.tree.map(one, tree)

    def cast_to_params(self, tree: PyTree) -> PyTree:
        """Floating leaves of ``tree`` in the params dtype (integers untouched)."""
        return self._cast(tree, self.params)

    def cast_to_compute(self, tree: PyTree) -> PyTree:
        """Floating leaves of ``tree`` in the compute dtype (integers untouched)."""
        return self._cast(tree, self.compute)

    def cast_to_output(self, tree: PyTree) -> PyTree:
        """Floating leaves of ``tree`` in the output dtype (integers untouched)."""
        return self._cast(tree, self.output)


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("float32", "float32", "float32", "float32"),
        Policy("mixed_bf16", "float32", "bfloat16", "float32"),
        Policy("pure_bf16", "bfloat16", "bfloat16", "float32"),
    )
}


def get_policy(name: str) -> Policy:
    """A policy from :data:`POLICIES` by name."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of {sorted(POLICIES)}")
    return POLICIES[name]
