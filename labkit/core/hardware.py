"""The GPU hardware table: the one source of peak figures (FLOP/s, bandwidths, sizes).

Dense peaks (no structured sparsity) per GPU from the vendors' public datasheets, which
quote sparse figures for tensor-core formats: those are halved here. The deviceless H100 and
B200 targets (:mod:`labkit.xla.aot`) are written from the ``H100 SXM`` and ``B200`` entries,
so the compiler and the roofline arithmetic see the same machine.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Precision = Literal["bf16", "fp8", "tf32", "fp32"]


@dataclasses.dataclass(frozen=True)
class Hardware:
    """Public peak figures of one accelerator (dense math, no structured sparsity).

    ``tf32_tflops`` is what a float32 matmul at JAX's DEFAULT precision gets on Ampere and
    Hopper tensor cores; ``fp32_tflops`` is plain float32 on the CUDA cores (what
    ``precision=HIGHEST`` gets). ``nvlink_gbps`` is the total NVLink bandwidth of one GPU.
    ``sm_count``, ``clock_ghz``, ``l2_mb`` and ``compute_capability`` describe the chip.
    """

    name: str
    bf16_tflops: float
    fp8_tflops: float | None
    tf32_tflops: float
    fp32_tflops: float
    hbm_gbps: float  # GB/s
    memory_gb: float
    nvlink_gbps: float | None  # GB/s, all links of one GPU
    sm_count: int | None  # None: not given here
    clock_ghz: float | None  # max boost
    l2_mb: float | None
    compute_capability: tuple[int, int]
    source: str

    def peak_tflops(self, precision: Precision) -> float:
        """Dense peak for ``precision``; raises ValueError when this GPU has none."""
        peaks = {
            "bf16": self.bf16_tflops,
            "fp8": self.fp8_tflops,
            "tf32": self.tf32_tflops,
            "fp32": self.fp32_tflops,
        }
        if precision not in peaks:
            raise ValueError(f"precision must be one of {sorted(peaks)}, got {precision!r}")
        peak = peaks[precision]
        if peak is None:
            raise ValueError(f"{self.name} has no {precision} tensor-core peak (no FP8 units)")
        return peak


_H100 = (
    "NVIDIA H100 Tensor Core GPU datasheet (2023), sparse tensor-core figures halved; "
    "SM count, clock and L2 from the NVIDIA H100 architecture whitepaper (2022)"
)
_H100_NVL = "NVIDIA H100 NVL datasheet (2023), per GPU, sparse tensor-core figures halved"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024), SXM, sparse figures halved"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021), 80GB SXM, sparse figures halved"
_B200 = (
    "NVIDIA DGX B200 datasheet (2024): 72 PFLOPS FP8, 36 PFLOPS FP16, 18 PFLOPS TF32 sparse "
    "over 8 GPUs, "
    "halved for dense; HGX B200: HBM3e 8 TB/s and NVLink 5 1.8 TB/s per GPU; "
    "SM count (148), max clock (1.965 GHz) and L2 (132644864 bytes = 126.5 MiB) as a B200 "
    "reports them in XLA's device spec, openxla/xla xla/tools/hlo_opt/gpu_specs/b200.txtpb "
    "(2025); compute capability 10.0 from the CUDA C Programming Guide"
)
# fmt: off
HARDWARE: dict[str, Hardware] = {h.name: h for h in (
    #        name        bf16    fp8     tf32   fp32  HBM GB/s mem   NVLink  SMs clock  L2   cc
    Hardware("H100 SXM", 989.0, 1979.0, 494.5, 67.0, 3350.0, 80.0, 900.0, 132, 1.98, 50.0,
             (9, 0), _H100),
    Hardware("H100 PCIe", 756.0, 1513.0, 378.0, 51.0, 2000.0, 80.0, 600.0, 114, 1.755, 50.0,
             (9, 0), _H100 + "; NVLink through a bridge"),
    Hardware("H100 NVL", 835.5, 1670.5, 417.5, 60.0, 3900.0, 94.0, 600.0, None, None, None,
             (9, 0), _H100_NVL),
    Hardware("H200", 989.0, 1979.0, 494.5, 67.0, 4800.0, 141.0, 900.0, 132, 1.98, 50.0,
             (9, 0), _H200),
    Hardware("A100 SXM", 312.0, None, 156.0, 19.5, 2039.0, 80.0, 600.0, 108, 1.41, 40.0,
             (8, 0), _A100),
    Hardware("B200", 2250.0, 4500.0, 1125.0, 80.0, 8000.0, 180.0, 1800.0, 148, 1.965, 126.5,
             (10, 0), _B200),
)}
# fmt: on

# Substrings of jax's device_kind (e.g. "NVIDIA H100 80GB HBM3") mapped to table names,
# most specific first: an "H100 NVL" or "H100 PCIe" must not read as an SXM part.
_KIND_PATTERNS: tuple[tuple[str, str], ...] = (
    ("H100 PCIE", "H100 PCIe"),
    ("H100 NVL", "H100 NVL"),
    ("H100", "H100 SXM"),
    ("H200", "H200"),
    ("A100", "A100 SXM"),
    ("B200", "B200"),
)


def hardware(name: str) -> Hardware:
    """Look up a GPU by table name (``"H100 SXM"``) or jax ``device_kind`` string."""
    if name in HARDWARE:
        return HARDWARE[name]
    upper = name.upper()
    for pattern, table_name in _KIND_PATTERNS:
        if pattern in upper:
            return HARDWARE[table_name]
    raise KeyError(
        f"no hardware entry for {name!r}; known GPUs: {', '.join(HARDWARE)}. "
        "Pass one of those names, or peak figures of your own to labkit.core.timing.mfu()."
    )


def current_hardware() -> Hardware | None:
    """The table entry of device 0 when it is a known GPU, else None (CPU has no entry)."""
    import jax

    device = jax.devices()[0]
    if device.platform != "gpu":
        return None
    try:
        return hardware(device.device_kind)
    except KeyError:
        return None


def ridge_intensity(gpu: str = "H100 SXM", precision: Precision = "bf16") -> float:
    """FLOPs per HBM byte at which a GPU's dense peak meets its memory bandwidth."""
    hw = hardware(gpu)
    return hw.peak_tflops(precision) * 1e12 / (hw.hbm_gbps * 1e9)


@dataclasses.dataclass(frozen=True)
class Latencies:
    """Fixed costs that dominate small programs, where bytes/bandwidth and FLOPs/peak vanish.

    ``kernel_floor_us`` is the least time one kernel occupies a GPU (launch and tail), whatever
    its work; ``collective_us`` the fixed cost (alpha) of one NCCL collective call on top of
    its bytes / bandwidth. Both are guessed constants, taken from XLA's GPU performance model
    (which weighs fusion decisions with them); XLA's latency-hiding scheduler does not use them
    (:mod:`labkit.xla.xla_estimate`), and real kernels and collectives can take longer
    (:func:`labkit.xla.predict.sensitivity` scales them).
    """

    kernel_floor_us: float
    collective_us: float
    source: str


LATENCIES = Latencies(
    kernel_floor_us=1.0,
    collective_us=5.0,
    source=(
        "XLA's GPU performance model, xla/service/gpu/model/gpu_performance_model_base.h "
        "(openxla/xla, 2024-2026): kKernelLaunchOverhead = 1 us and kNcclKernelLaunchOverhead "
        "= 5 us, 'estimated values in the absence of easy ways to query them'"
    ),
)
