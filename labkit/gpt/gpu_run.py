"""The measured part of ``labkit gpu-check``: GPT steps on this machine's GPUs beside the model.

For each strategy and flag set (:data:`CASES`) the GPT step is compiled for the local GPUs
(XLA autotunes on a GPU: these are tuned programs), timed, and set beside the kit's model of
the same compiled program (:func:`labkit.xla.predict.predict`: the model's range, not a
bound) and XLA's own estimate, read from the timed compile's schedule dump
(:func:`xla_estimate_us`). MFU is the program's FLOPs per GPU over the measured time and the
GPU's published bf16 peak. FP8 over bf16 times the FP8 GPT step (``fp8_dot_general`` in
every ``nnx.Linear``) against the bf16 one on one GPU; GPUs without FP8 tensor cores
(compute capability below 8.9, e.g. an A100's sm_80) skip it and say so.
:func:`dump_autotune` keeps XLA's autotune results of the kit's presets for deviceless
compiles (:mod:`labkit.xla.autotune`).

Everything that needs a GPU raises :class:`NoGpu` without one; the arithmetic (verdicts, MFU,
which cases fit the GPUs) is plain functions, tested on CPU.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from labkit.core.hardware import Hardware, hardware
from labkit.xla.xla_schedule import dump_options

if TYPE_CHECKING:
    import jax

    from labkit.parallel.sharding import Strategy

__all__ = [
    "CASES",
    "FP8_MIN_CAPABILITY",
    "Case",
    "NoGpu",
    "StepResult",
    "cases_for",
    "dump_autotune",
    "fp8_over_bf16",
    "fp8_supported",
    "measure_steps",
    "mfu",
    "verdict",
    "xla_estimate_us",
]

FP8_MIN_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (8.9), Hopper (9.0), Blackwell (10.x)
DEVICELESS_BATCH_PER_GPU = 4  # the kit's deviceless steps: batch 32 over 8 H100s


class NoGpu(RuntimeError):
    """A measurement that needs NVIDIA GPUs ran where JAX has none."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One step to measure: a strategy and a flag set (per-compile XLA options)."""

    name: str
    strategy: Strategy
    flags: Mapping[str, str | bool | int]
    min_gpus: int = 1


CASES: tuple[Case, ...] = (
    Case("DP, XLA defaults", "dp", {}),
    Case("DP, no all-reduce combining", "dp", {"xla_gpu_all_reduce_combine_threshold_bytes": 0}, 2),
    Case(
        "DP, latency-hiding scheduler off",
        "dp",
        {"xla_gpu_enable_latency_hiding_scheduler": False},
        2,
    ),
    Case("FSDP, XLA defaults", "fsdp", {}, 2),
)


def cases_for(num_gpus: int, cases: Sequence[Case] = CASES) -> tuple[list[Case], list[str]]:
    """The cases that mean something on ``num_gpus`` GPUs, and a reason for each skipped one
    (on one GPU there is no collective for a flag to change, nothing for FSDP to shard)."""
    kept = [c for c in cases if num_gpus >= c.min_gpus]
    skipped = [
        f"{c.name}: needs {c.min_gpus}+ GPUs (this machine has {num_gpus}), nothing to compare"
        for c in cases
        if num_gpus < c.min_gpus
    ]
    return kept, skipped


def fp8_supported(capability: tuple[int, int]) -> bool:
    """Whether a GPU of this compute capability has FP8 tensor cores (sm_89 and up)."""
    return tuple(capability) >= FP8_MIN_CAPABILITY


def verdict(measured_us: float, low_us: float, high_us: float) -> str:
    """Where a measured step falls against the model's range, in words."""
    if measured_us < low_us:
        return f"below the model's range ({measured_us / low_us:.2f}x its floor)"
    if measured_us > high_us:
        return f"above the model's range ({measured_us / high_us:.2f}x its ceiling)"
    return "within the model's range"


def mfu(flops_per_gpu: float, seconds: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation: FLOPs per GPU per second over the GPU's peak."""
    if seconds <= 0 or peak_tflops <= 0:
        raise ValueError(f"need a positive time and peak, got {seconds} s and {peak_tflops}")
    return flops_per_gpu / seconds / (peak_tflops * 1e12)


def xla_estimate_us(folder: str | Path, hlo: str) -> float | None:
    """XLA's own estimate of the step, in us, from the schedule dump a compile wrote into
    ``folder`` (:func:`labkit.xla.xla_schedule.dump_options`); None when XLA wrote none (its
    scheduler had no async work to order)."""
    from labkit.xla import xla_estimate

    found = xla_estimate.estimate_folder(folder, hlo)
    return None if found is None else float(found.step_us)


@dataclasses.dataclass(frozen=True)
class StepResult:
    """One measured step beside the model's range and XLA's estimate."""

    case: str
    num_gpus: int
    measured_us: float
    model_low_us: float
    model_high_us: float
    xla_us: float | None
    mfu: float
    verdict: str


def _gpus() -> tuple[list[jax.Device], Hardware | None]:
    import jax

    devices = [d for d in jax.devices() if d.platform == "gpu"]
    if not devices:
        raise NoGpu("JAX sees no GPU here: run labkit gpu-check on a machine with NVIDIA GPUs")
    try:
        hw: Hardware | None = hardware(devices[0].device_kind)
    except KeyError:
        hw = None
    return devices, hw


def measure_steps(
    preset: str = "small", batch_per_gpu: int = 8, repeats: int = 20
) -> tuple[list[StepResult], list[str]]:
    """Time each case of :data:`CASES` that fits the local GPUs; the results and the skips."""
    from labkit.gpt.compile import local_train_step, time_steps
    from labkit.xla.predict import predict

    devices, hw = _gpus()
    kept, skipped = cases_for(len(devices))
    kind = hw.name if hw else "H100 SXM"  # the model needs a table entry: say which below
    if hw is None:
        skipped.append(f"{devices[0].device_kind} is not in the hardware table: modelled as H100")
    results = []
    for case in kept:
        with tempfile.TemporaryDirectory(prefix="labkit-gpu-check-") as folder:
            options = {**case.flags, **dump_options(folder)}  # the timed compile's own schedule
            compiled, state, batch = local_train_step(
                preset, case.strategy, batch_per_gpu * len(devices), options
            )
            hlo = compiled.as_text() or ""
            xla_us = xla_estimate_us(folder, hlo)
        timing = time_steps(compiled, state, batch, repeats=repeats)
        model = predict(hlo, kind)
        seconds = timing.median
        results.append(
            StepResult(
                case.name,
                len(devices),
                seconds * 1e6,
                model.lower_s * 1e6,
                model.upper_s * 1e6,
                xla_us,
                mfu(model.flops / model.num_devices, seconds, hardware(kind).bf16_tflops),
                verdict(seconds * 1e6, model.lower_s * 1e6, model.upper_s * 1e6),
            )
        )
    return results, skipped


def fp8_over_bf16(preset: str = "small", batch: int = 8, repeats: int = 20) -> float | str:
    """bf16 step time over FP8 step time on one GPU (> 1: FP8 faster), or why it was skipped."""
    import jax.numpy as jnp

    from labkit.gpt.compile import local_train_step, time_steps
    from labkit.gpt.config import GPTConfig
    from labkit.numerics import fp8

    devices, hw = _gpus()
    capability = hw.compute_capability if hw else (0, 0)
    if not fp8_supported(capability):
        return (
            f"skipped: {devices[0].device_kind} (compute capability {capability[0]}."
            f"{capability[1]}) has no FP8 tensor cores (sm_89 and up)"
        )
    times = {}
    for name, dot in (("bf16", None), ("fp8", fp8.fp8_dot_general)):
        extra = {} if dot is None else {"dot_general": dot}
        cfg = GPTConfig.preset(preset, dtype=jnp.bfloat16, **extra)
        compiled, state, tokens = local_train_step(cfg, "dp", batch, devices=devices[:1])
        times[name] = time_steps(compiled, state, tokens, repeats=repeats).median
    return times["bf16"] / times["fp8"]


def dump_autotune(
    preset: str, folder: Path, driver: str, store: Path | None = None
) -> tuple[Path, Path]:
    """Compile the preset's DP step on the local GPUs with XLA's autotune results dumped,
    rewrite them for the deviceless target and keep them (:mod:`labkit.xla.autotune`).

    The per-GPU batch is the deviceless steps' (:data:`DEVICELESS_BATCH_PER_GPU`), so the
    GEMM fusions have the shapes, hence the keys, of the kit's 8-GPU programs.
    """
    import jax
    import jaxlib

    from labkit.gpt.compile import local_train_step
    from labkit.xla import autotune

    devices, hw = _gpus()
    if hw is None:
        raise NoGpu(f"{devices[0].device_kind} has no deviceless target in the kit")
    path = folder / f"{preset}.autotune.textproto"
    batch = DEVICELESS_BATCH_PER_GPU * len(devices)
    local_train_step(preset, "dp", batch, autotune.dump_options(path))
    text, originals = autotune.rewrite_device(path.read_text(), hw.name)
    entries = autotune.parse_results(text)
    record = autotune.DumpRecord(
        preset=preset,
        kind=hw.name,
        gpu=devices[0].device_kind,
        driver=driver,
        jaxlib=f"{jax.__version__} / jaxlib {jaxlib.__version__}",
        device_strings=originals,
        entries=len(entries),
        triton_entries=sum(autotune.config_of(e) is not None for e in entries),
    )
    return autotune.write_stored(text, record, store or autotune.STORE)
