"""00_welcome: the schedule of the compiled steps, the roofline picture, the exercise checkers."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

from labkit.core.feedback import Feedback, check_integer, check_number, judge, unanswered
from labkit.core.figures import Picture, Series, roofline
from labkit.core.hardware import Precision, hardware, ridge_intensity
from labkit.core.timing import RooflinePoint
from labkit.xla import hlo
from labkit.xla.cost import kernel_flops
from labkit.xla.hlo_text import parse_module
from labkit.xla.overlap import kernel_cost


def entry_collectives(compiled_hlo: str) -> list[dict[str, str | int]]:
    """The entry computation's collectives in schedule order: kind, bytes, async or sync, and
    how many matmul kernels (dots, GEMM fusions or cuBLAS calls) run before and after each."""
    module = parse_module(compiled_hlo)
    entry = module.computations[module.entry]
    matmuls = [i.index for i in entry if sum(kernel_flops(module, i).values()) > 0]
    index = {i.name: i.index for i in entry}
    return [
        {
            "kind": c.kind,
            "bytes": c.bytes,
            "mode": "async" if c.is_async else "sync",
            "matmuls_before": sum(m < index[c.name] for m in matmuls),
            "matmuls_after": sum(m > index[c.name] for m in matmuls),
        }
        for c in hlo.collectives(compiled_hlo)
        if c.name in index
    ]


@dataclasses.dataclass(frozen=True)
class KernelPoint:
    """One compute kernel of a compiled program on the roofline, by the kit's cost model.

    ``intensity`` is its matrix FLOPs per HBM byte (from the HLO shapes); ``tflops`` what
    it would reach in its modelled time ``max(floor, FLOPs / peak, bytes / bandwidth)``:
    modelled, not measured.
    """

    name: str
    flops: float
    hbm_bytes: float
    seconds: float

    @property
    def intensity(self) -> float:
        """FLOPs per HBM byte."""
        return self.flops / self.hbm_bytes

    @property
    def tflops(self) -> float:
        """Modelled TFLOP/s: its FLOPs over its modelled time."""
        return self.flops / self.seconds / 1e12


def kernel_points(compiled_hlo: str, gpu: str = "H100 SXM") -> list[KernelPoint]:
    """The entry computation's kernels that do matrix FLOPs, in schedule order, each with
    its FLOPs, HBM bytes and modelled time on ``gpu`` (:func:`labkit.xla.overlap.kernel_cost`;
    a loop counts as one point, its body times its trips)."""
    module = parse_module(compiled_hlo)
    hw = hardware(gpu)
    points = []
    for inst in module.computations[module.entry]:
        cost = kernel_cost(module, inst, hw)
        if cost.flops > 0 and cost.hbm_bytes > 0:
            points.append(KernelPoint(inst.name, cost.flops, cost.hbm_bytes, cost.seconds))
    return points


ROOFS: tuple[Precision, ...] = ("tf32", "bf16", "fp8")  # the roofs drawn: float32 runs as TF32


def roofline_picture(
    measured: Sequence[RooflinePoint],
    device_kind: str,
    kernels: Sequence[KernelPoint] = (),
    kernels_label: str = "kernels",
    gpu: str = "H100 SXM",
) -> Picture:
    """The roofline of ``gpu`` (TF32, bf16 and FP8 peaks, HBM bandwidth) with this machine's
    measured matmuls and their best as a measured roof, and ``kernels`` placed by the model."""
    hw = hardware(gpu)
    roofs = {f"{hw.name} {p.upper()} (datasheet)": hw.peak_tflops(p) for p in ROOFS}
    series = []
    for dtype in dict.fromkeys(p.dtype for p in measured):
        mine = [p for p in measured if p.dtype == dtype]
        series.append(
            Series(
                f"{dtype} matmul n x n, measured",
                [p.intensity for p in mine],
                [p.tflops for p in mine],
                names=[f"n={p.n}" for p in mine],
            )
        )
    if kernels:
        series.append(
            Series(
                f"{kernels_label} on {hw.name} (modelled)",
                [k.intensity for k in kernels],
                [k.tflops for k in kernels],
                style="x",
            )
        )
    best = max(p.tflops for p in measured)
    return roofline(
        f"Roofline: {hw.name} roofs, {device_kind} measured",
        roofs,
        (f"{hw.name} HBM (datasheet)", hw.hbm_gbps),
        series,
        measured_roofs={f"{device_kind}: best measured": best},
        note="Log-log axes. Datasheet roofs are dense peaks; measured points are this machine's.",
    )


def check_ridge_matmul_size(answer: object, gpu: str = "H100 SXM") -> Feedback:
    """00.1: smallest square bf16 matmul size n that is compute-bound on ``gpu``.

    A bf16 n x n matmul does 2 n^3 FLOPs and moves at least 3 n^2 * 2 bytes, so its
    intensity is n / 3 FLOP/byte; it is compute-bound once n / 3 reaches the ridge.
    """
    expected = 3 * ridge_intensity(gpu)
    return check_number(
        "00.1",
        answer,
        expected,
        0.05,
        "intensity of a bf16 n x n matmul is 2n^3 / (3 * 2 n^2) = n/3 FLOP/byte; "
        "set it equal to peak FLOP/s / bandwidth from labkit.core.hardware.hardware(...)",
    )


def check_all_reduce_count(answer: object, compiled_hlo: str) -> Feedback:
    """00.2: how many all-reduce collectives (async pairs counted once) the HLO has."""
    expected = sum(c.kind == "all-reduce" for c in hlo.collectives(compiled_hlo))
    return check_integer(
        "00.2",
        answer,
        expected,
        f"{expected} all-reduce(s): one per combined gradient group.",
        "count lines whose op is all-reduce or all-reduce-start (a -done line ends the same "
        "collective); labkit.xla.hlo.collectives(hlo) does this",
    )


def check_matmuls_before_gather(answer: object, fsdp_hlo: str) -> Feedback:
    """00.p1 (predict): matmul kernels the FSDP step runs before its first all-gather."""
    gathers = [r for r in entry_collectives(fsdp_hlo) if r["kind"] == "all-gather"]
    expected = int(gathers[0]["matmuls_before"]) if gathers else -1
    return check_integer(
        "00.p1",
        answer,
        expected,
        f"{expected}: XLA gathers before that many matmuls; the next cells show where.",
        "not what XLA did: the next cells list each collective with the matmuls before it",
    )


def check_tp_program(answer: object) -> Feedback:
    """00.3: the tiny GPT's tensor-parallel step compiled for a 4 x 2 mesh of H100s: its
    activation all-reduces run over the 2 GPUs of the ``model`` axis."""
    if unanswered(answer):
        return judge("00.3", answer, False, "", "")
    text, devices = getattr(answer, "hlo", None), getattr(answer, "num_devices", None)
    if not isinstance(text, str) or devices != 8:
        return Feedback(
            "00.3", False, True, "give aot.compile_for_gpu(step, state, batch)'s result, 8 GPUs"
        )
    groups = Counter(c.group_size for c in hlo.collectives(text) if c.kind == "all-reduce")
    return judge(
        "00.3",
        answer,
        groups[2] > 0,
        f"{groups[2]} all-reduces over the 2 GPUs of a model group: the activations.",
        f"all-reduce group sizes {dict(groups)}: was the mesh (4, 2) with axes "
        "('data', 'model'), and the strategy 'tp'?",
    )
