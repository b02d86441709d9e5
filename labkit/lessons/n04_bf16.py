"""04_bf16: matmuls compiled for H100s per precision, GPT training per dtype policy, checkers.

The numerics (formats, error metrics, HLO readers, policies) live in
:mod:`labkit.numerics.precision`; this module runs the notebook's experiments with them.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from labkit.core.feedback import Feedback, check_integer, check_number, judge, unanswered
from labkit.core.figures import Picture, Series, log_ticks, new_figure, number, picture, sweep
from labkit.core.mesh import abstract, make_mesh
from labkit.gpt import data, train
from labkit.gpt.config import GPTConfig
from labkit.numerics.precision import (
    FORMATS,
    errors,
    get_format,
    get_policy,
    grid,
    round_to,
    spacing,
)
from labkit.xla.aot import AotResult, compile_for_gpu, h100_mesh
from labkit.xla.flags import run_with_flags
from labkit.xla.gemms import Gemm, convert_counts, gemms
from labkit.xla.hlo_text import instructions

if TYPE_CHECKING:
    import optax

TICKED = ("bfloat16", "float8_e4m3fn", "float8_e5m2")  # formats whose values are ticked


def formats_picture(lo: float = 1.0, hi: float = 4.0) -> Picture:
    """Left: every value of bfloat16 and the FP8 formats in ``[lo, hi]``. Right: the gap
    between neighbours relative to the value (ulp / |x|) over each format's whole range."""
    fig, (left, right) = new_figure(ncols=2, size=(11, 3.8))
    counts = {}
    for row, name in enumerate(TICKED):
        values = grid(name, lo, hi)
        counts[name] = len(values)
        left.plot(values, np.full_like(values, row), "|", markersize=14, label=name)
    left.set_yticks(range(len(TICKED)), [n.replace("float8_", "") for n in TICKED])
    left.set(xlabel="value", ylabel="format", title=f"representable values in [{lo:g}, {hi:g}]")
    x = np.logspace(-45, 38.5, 2000)  # |x|
    for f in FORMATS.values():
        inside = (x >= f.smallest_subnormal) & (x <= f.max)
        right.loglog(x[inside], spacing(x[inside], f) / x[inside], label=f.name, lw=1)
    right.set(xlabel="|x|", ylabel="ulp / |x| (relative gap)", title="relative spacing")
    log_ticks(right.xaxis)
    log_ticks(right.yaxis)
    right.legend(fontsize=7)
    said = ", ".join(f"{n} {c}" for n, c in counts.items())
    flat = ", ".join(
        f"{f.name} {number(f.unit_roundoff)} to {number(f.eps)}" for f in FORMATS.values()
    )
    caption = (
        f"Values in [{lo:g}, {hi:g}]: {said} (2^mantissa bits per power of two). In the normal "
        f"range ulp / |x| stays between eps/2 and eps: {flat}; below the smallest normal it "
        "rises (subnormals: a fixed gap)."
    )
    return picture(fig, "Floating-point formats: values and their spacing", caption)


# The input formats of the error sweep, most mantissa bits first: float32, then each rounded.
SWEPT_FORMATS = (
    "float32",
    "tensorfloat32",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
)


def rounded_input_errors(
    a: np.ndarray, b: np.ndarray, formats: Sequence[str] = SWEPT_FORMATS
) -> dict[str, float]:
    """Normwise relative error of ``a @ b`` per input format: both inputs rounded to it
    (emulated, so FP8 works on any CPU), multiplied and accumulated in float32, against the
    float64 product of the unrounded inputs."""
    reference = a.astype(np.float64) @ b.astype(np.float64)  # (m, n)
    found = {}
    for name in formats:
        x, y = (jnp.asarray(round_to(v, name), jnp.float32) for v in (a, b))
        found[name] = errors(np.asarray(jnp.matmul(x, y)), reference, "float32").norm_rel
    return found


def error_sweep_picture(found: Mapping[str, float], size: int) -> Picture:
    """Matmul error against the input format's mantissa bits, beside each format's eps/2."""
    names = sorted(found, key=lambda n: get_format(n).mantissa_bits)
    bits = [float(get_format(n).mantissa_bits) for n in names]
    short = [
        get_format(n).name.replace("float8_", "").replace("tensorfloat32", "TF32") for n in names
    ]
    return sweep(
        f"Matmul error against the input format ({size} x {size}, float32 accumulation)",
        "mantissa bits of the input format",
        {
            "normwise relative error (log scale)": [
                Series("measured on this CPU", bits, [found[n] for n in names], names=short),
                Series(
                    "eps/2 of the format",
                    bits,
                    [get_format(n).unit_roundoff for n in names],
                    style="--",
                ),
            ]
        },
        yscale="log",
        x_unit="bits",
        note="Both inputs rounded to the format (emulated), float64 reference.",
    )


def h100_matmul(
    precision: jax.lax.PrecisionLike,
    dtype: DTypeLike = jnp.float32,
    num_gpus: int = 8,
    n: int = 1024,
) -> AotResult:
    """``x @ w`` with ``precision=`` compiled for ``num_gpus`` H100s (x split by rows).

    x is ``(num_gpus * n, n)`` sharded over a "data" axis, w ``(n, n)`` replicated.
    """
    mesh = h100_mesh((num_gpus,), ("data",))
    x = abstract(jax.ShapeDtypeStruct((num_gpus * n, n), dtype), mesh, jax.P("data"))
    w = abstract(jax.ShapeDtypeStruct((n, n), dtype), mesh)
    return compile_for_gpu(lambda a, b: jnp.matmul(a, b, precision=precision), x, w)


def gemm_row(name: str, gemm: Gemm, num_gpus: int) -> dict[str, str | int]:
    """A table row describing one compiled GEMM."""
    return {
        "asked for": name,
        "GPUs": num_gpus,
        "kernel": gemm.kernel,
        "operands": f"{gemm.lhs} x {gemm.rhs} -> {gemm.out}",
        "precision": gemm.precision,
        "algorithm": gemm.algorithm or "(none)",
    }


@dataclasses.dataclass(frozen=True)
class TrainRun:
    """Loss curves of one dtype policy, one per seed, and the step's program twice: as JAX
    writes it (``lowered``: HLO text before XLA optimizes it) and as XLA:CPU compiled it."""

    policy: str
    losses: dict[int, np.ndarray]  # seed -> (steps,)
    hlo: str  # the optimized CPU program
    compile_s: float
    lowered: str = ""  # the lowered program (HLO text), before any XLA pass


def train_run(
    policy: str,
    steps: int,
    batch_size: int,
    seeds: Sequence[int] = (0,),
    lr: float = 1e-3,
    preset: str = "tiny",
) -> TrainRun:
    """Train the GPT under a dtype policy from each seed; compile the step once (one device).

    A seed fixes the initial weights (drawn in the params dtype) and the batches
    (``labkit.gpt.data.batch_at``), whatever the policy: runs with one seed see the same data.
    """
    cfg = GPTConfig.preset(preset, **get_policy(policy).config_overrides())
    tx = train.make_tx(lr)
    compiled, abstract_state, abstract_batch, compile_s, lowered = _one_device_step(
        cfg, batch_size, tx
    )
    tokens = data.encode(data.corpus())
    losses = {}
    for seed in seeds:
        state = train.init_train_state(cfg, abstract_state, tx, seed=seed)
        curve = []
        for batch in data.batches(tokens, batch_size, cfg.seq_len, seed=seed, steps=steps):
            state, loss = compiled(state, jax.device_put(batch, abstract_batch.sharding))
            curve.append(loss)
        losses[seed] = np.asarray(jax.device_get(curve), dtype=np.float64)  # (steps,)
    return TrainRun(policy, losses, compiled.as_text() or "", compile_s, lowered)


def _one_device_setup(
    cfg: GPTConfig, batch_size: int, tx: optax.GradientTransformation
) -> tuple[jax.stages.Wrapped, train.State, jax.ShapeDtypeStruct]:
    """The data-parallel train step on one CPU device: ``(jitted step, state, batch)``,
    the latter two abstract."""
    mesh = make_mesh((1,), ("data",), devices=jax.devices()[:1])
    return train.train_setup(cfg, mesh, "dp", batch_size, tx)


def _one_device_step(
    cfg: GPTConfig, batch_size: int, tx: optax.GradientTransformation
) -> tuple[jax.stages.Compiled, train.State, jax.ShapeDtypeStruct, float, str]:
    """The train step compiled for one CPU device: ``(compiled, state, batch, seconds,
    lowered)``; ``lowered``: the program as JAX writes it (HLO text, before XLA's passes)."""
    step, abstract_state, abstract_batch = _one_device_setup(cfg, batch_size, tx)
    start = time.perf_counter()
    lowered = step.lower(abstract_state, abstract_batch)
    compiled = lowered.compile()
    seconds = time.perf_counter() - start
    return compiled, abstract_state, abstract_batch, seconds, str(lowered.as_text(dialect="hlo"))


@functools.cache
def lowered_step_hlo(policy: str, num_layers: int, batch_size: int, preset: str = "tiny") -> str:
    """The one-device train step under ``policy`` with ``num_layers`` blocks as JAX writes it:
    HLO text of the lowered program, before any XLA pass (nothing is compiled; kept for the
    process). Its casts are the policy's own, whatever backend compiles it later."""
    overrides = {**get_policy(policy).config_overrides(), "num_layers": num_layers}
    cfg = GPTConfig.preset(preset, **overrides)
    step, abstract_state, abstract_batch = _one_device_setup(cfg, batch_size, train.make_tx(1e-3))
    return str(step.lower(abstract_state, abstract_batch).as_text(dialect="hlo"))


def loss_gap(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Largest and mean per-step ``|a - b|`` of two loss curves of the same length."""
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if x.shape != y.shape:
        raise ValueError(f"loss curves differ in length: {x.shape} vs {y.shape}")
    gap = np.abs(x - y)
    return {"max": float(gap.max()), "mean": float(gap.mean())}


# ---------------------------------------------------------------------------------------
# Checkers


def check_exact_integers(answer: object, name: str = "float16") -> Feedback:
    """04.1: the largest N such that every integer 0..N is exactly representable in ``name``."""
    stored = get_format(name).mantissa_bits
    bits = stored + 1  # significand bits, implicit 1 included
    return check_integer(
        "04.1",
        answer,
        2**bits,
        f"{2**bits}: {bits} significand bits ({stored} stored + the implicit 1) hold every "
        f"integer up to 2^{bits}; {2**bits + 1} already rounds to a neighbour.",
        f"bfloat16 rounds 257 because 8 significand bits end at 2^8. How many has {name}? "
        f"(FORMATS[{name!r}].mantissa_bits + 1), or try round_to(np.arange(5000.0), {name!r})",
    )


def check_default_precision(answer: Any, num_gpus: int = 8) -> Feedback:
    """04.2: a value of JAX's ``jax_default_matmul_precision`` setting under which a float32
    ``x @ w`` that names no ``precision=`` stays float32 on 8 H100s.

    The checker compiles ``x @ w`` for ``num_gpus`` H100s inside
    ``jax.default_matmul_precision(answer)`` and reads the GEMM.
    """
    if unanswered(answer):
        return judge("04.2", answer, False, "", "")
    try:
        with jax.default_matmul_precision(answer):
            found = gemms(h100_matmul(None, num_gpus=num_gpus, n=256).hlo)
    except (ValueError, TypeError) as err:
        return Feedback("04.2", False, True, f"the setting does not take {answer!r}: {err}")
    ok = bool(found) and all(
        g.precision == "HIGHEST" or "f32_f32_f32" in g.algorithm for g in found
    )
    got = f"{found[0].precision} {found[0].algorithm}".strip() if found else "no GEMM"
    return judge(
        "04.2",
        answer,
        ok,
        f"right: under {answer!r} the GEMM compiled for {num_gpus} H100s keeps operand_precision "
        "HIGHEST, full float32, in every matmul that does not name its own precision=.",
        f"under {answer!r} the GEMM compiled for {num_gpus} H100s has precision {got}: not "
        "float32. The setting takes Precision names (lower case), format names and the presets' "
        "names; which kind survived section 3's 8-GPU compile?",
    )


def float32_dot_forms(hlo: str) -> dict[str, int]:
    """The float32 dots of a compiled program, by form: what made XLA widen them.

    ``"token-contracting"``: both operands contract over their first axis (a weight gradient,
    ``x.T @ dy`` over the tokens); ``"batched"``: a dot with batch dimensions (attention);
    ``"other"``: anything else.
    """
    forms = {"token-contracting": 0, "batched": 0, "other": 0}
    for inst in instructions(hlo):
        if inst.opcode != "dot" or not inst.shape.startswith("f32["):
            continue
        attrs = inst.attributes
        if attrs.get("lhs_batch_dims"):
            forms["batched"] += 1
        elif attrs.get("lhs_contracting_dims") == attrs.get("rhs_contracting_dims") == "{0}":
            forms["token-contracting"] += 1
        else:
            forms["other"] += 1
    return forms


def check_convert_count(
    answer: object, batch_size: int, num_layers: int = 3, pair: str = "f32->bf16"
) -> Feedback:
    """04.3: how many ``convert`` ops of ``pair`` JAX writes into the mixed-precision step with
    ``num_layers`` blocks; the checker lowers that step (:func:`lowered_step_hlo`)."""
    if unanswered(answer):
        return judge("04.3", answer, False, "", "")
    expected = convert_counts(lowered_step_hlo("mixed_bf16", num_layers, batch_size))[pair]
    return check_integer(
        "04.3",
        answer,
        expected,
        f"{expected} {pair} converts with {num_layers} layers: a fixed part (embedding, head, "
        "loss) and the same number again for each layer.",
        f"not {num_layers} layers' count. Which casts belong to a layer, and which to the "
        "embedding, the head and the loss? (count = fixed + per layer x layers)",
    )


# ---------------------------------------------------------------------------------------
# A bug report: Shardy drops a dot's algorithm


SHARDY_REPRODUCER = '''\
"""Shardy drops a dot's `algorithm` (DotAlgorithmPreset) on 8 devices, partitioned or not.

Runs on a CPU (8 virtual devices): the compiled HLO of a matmul with
precision=DotAlgorithmPreset.BF16_BF16_F32 keeps `algorithm=dot_bf16_bf16_f32` on one
device and under GSPMD, but loses it on 8 devices under Shardy (the default partitioner),
even with both operands replicated (nothing partitioned); on a GPU the GEMM then runs at
DEFAULT precision (TF32 for float32) instead of BF16_BF16_F32.
"""
import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
import jax.numpy as jnp
import jaxlib
from jax.sharding import NamedSharding, PartitionSpec as P

PRESET = jax.lax.DotAlgorithmPreset.BF16_BF16_F32


def algorithm_kept(num_devices: int, shardy: bool, x_spec: P) -> bool:
    jax.config.update("jax_use_shardy_partitioner", shardy)
    mesh = jax.make_mesh((num_devices,), ("data",), devices=jax.devices()[:num_devices])
    x = jax.ShapeDtypeStruct((512, 64), jnp.float32, sharding=NamedSharding(mesh, x_spec))
    w = jax.ShapeDtypeStruct((64, 64), jnp.float32, sharding=NamedSharding(mesh, P()))
    matmul = jax.jit(lambda a, b: jnp.matmul(a, b, precision=PRESET))
    return "algorithm=dot_bf16_bf16_f32" in matmul.lower(x, w).compile().as_text()


print("jax", jax.__version__, "jaxlib", jaxlib.__version__)
for num_devices, shardy, x in ((1, True, "split"), (8, True, "split"),
                               (8, True, "replicated"), (8, False, "split")):
    kept = algorithm_kept(num_devices, shardy, P("data") if x == "split" else P())
    print(f"devices={num_devices} shardy={shardy} x={x} algorithm_kept={kept}")
'''
"""A script a learner can paste into a JAX bug report (jax only, runs on any CPU)."""


def run_reproducer(timeout_s: float = 120.0) -> str:
    """Run :data:`SHARDY_REPRODUCER` in a fresh Python process (no XLA_FLAGS of this one: it
    sets its own); its standard output."""
    run = run_with_flags([], SHARDY_REPRODUCER, timeout_s=timeout_s)
    if run.returncode != 0:
        raise RuntimeError(
            f"the reproducer exited {run.returncode}; its last output:\n{run.stderr[-2000:]}"
        )
    return run.stdout


def reproducer_verdicts(stdout: str) -> dict[tuple[int, bool, str], bool]:
    """``(devices, shardy, x) -> algorithm kept`` (``x``: ``"split"`` over the devices or
    ``"replicated"``), read from :func:`run_reproducer`'s output."""
    line = r"devices=(\d+) shardy=(True|False) x=(\w+) algorithm_kept=(True|False)"
    found = re.findall(line, stdout)
    return {(int(n), s == "True", x): k == "True" for n, s, x, k in found}


def check_bf16_increment(answer: object) -> Feedback:
    """04.p1 (predict): what ``1 + 1e-3`` becomes when rounded to bfloat16."""
    expected = float(round_to(1 + 1e-3, "bfloat16"))
    above_one = 1 + get_format("bfloat16").eps  # 1 + 2**-7
    return check_number(
        "04.p1",
        answer,
        expected,
        1e-6,
        f"bfloat16 keeps 8 significant bits: the next value above 1 is 1 + 2**-7 ({above_one!r})",
    )
