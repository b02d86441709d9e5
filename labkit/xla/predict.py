"""The kit's model of a compiled GPU program's step time: a range, with every term shown.

A model read from the compiled program (nothing runs): each kernel costs
``max(floor, FLOPs / peak, bytes / HBM)`` and each collective ``alpha + bytes / link``, minus
what the kernels scheduled beside it hide (:mod:`labkit.xla.overlap`, whose docstring gives
the terms and their sources). For one device of an SPMD program, **the model's range**:

- **low end** = ``max(math, memory, exposed communication, kernels x floor)``: the busiest
  resource, or the kernels' floors;
- **high end** = ``sum over kernels of max(floor, math, memory) + exposed
  communication``: every kernel back to back, none overlapping another.

Both ends rest on two guessed constants, the per-kernel floor and the per-collective alpha
(:data:`labkit.core.hardware.LATENCIES`): real small kernels and small collectives can take
longer, so neither end is a bound on what a GPU does. :func:`sensitivity` shows how the range
moves when the constants double or quadruple; :mod:`labkit.xla.xla_estimate` sets XLA's own
estimate beside it.

Small programs sit on the floor: hundreds of microsecond-long kernels. Launching them is
the host's job; XLA's command buffers (CUDA graphs, on by default for fusions and library
calls: ``xla_gpu_enable_command_buffer``) record runs of them so the host launches one graph
instead of each kernel, which is what lets a GPU get near the floor at all. This jaxlib
forms them from the runtime's thunks after the HLO is final, so the HLO text does not show
them. Loops count their trips.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TypedDict

from labkit.core.hardware import LATENCIES, Hardware, Latencies, hardware
from labkit.xla import overlap
from labkit.xla.cost import hlo_flops
from labkit.xla.hlo_text import CALLEE_KEYS, Module, parse_module, per_module

__all__ = [
    "RANGE_HIGH",
    "RANGE_LOW",
    "SensitivityRow",
    "StepPrediction",
    "TermRow",
    "formula",
    "predict",
    "round_sig",
    "sensitivity",
    "trip_multipliers",
]

RANGE_LOW = "model's range, low end"
RANGE_HIGH = "model's range, high end"


class TermRow(TypedDict):
    """One term of a :class:`StepPrediction`: microseconds (a count for ``kernels`` and
    ``collectives``) and how it is computed."""

    term: str
    us: float
    how: str


def round_sig(x: float, digits: int = 2) -> float:
    """``x`` rounded to ``digits`` significant digits (what a datasheet model supports)."""
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


def _calls(module: Module, name: str) -> list[tuple[str, int]]:
    """``(callee, runs per run of name)`` for each instruction of ``name`` and what it calls:
    a loop its body ``trip_count`` times (1 when XLA knows none) and its condition once more;
    anything else each computation it names once (a conditional: each branch)."""
    out = []
    for inst in module.computations.get(name, ()):
        trips = 1 if inst.trip_count is None else inst.trip_count
        runs = {"body": trips, "condition": trips + 1} if inst.opcode == "while" else {}
        called = {c: runs.get(key, 1) for key in CALLEE_KEYS for c in inst.callees(key)}
        out += [(c, n) for c, n in called.items() if c in module.computations]
    return out


def trip_multipliers(module: Module) -> dict[str, int]:
    """How many times each computation runs per execution of the entry: summed over the
    instructions that call it, each call as often as its computation runs, times the runs
    per call (loops: their trips; a conditional's branches each as if taken every time)."""
    return dict(_trip_multipliers(module))


@per_module  # read often
def _trip_multipliers(module: Module) -> dict[str, int]:
    calls = {name: _calls(module, name) for name in module.computations}
    waiting = {name: 0 for name in module.computations}  # calls not yet counted
    reached, todo = {module.entry}, [module.entry]
    while todo:
        for callee, _ in calls[todo.pop()]:
            waiting[callee] += 1
            if callee not in reached:
                reached.add(callee)
                todo.append(callee)
    times, ready = dict.fromkeys(reached, 0) | {module.entry: 1}, [module.entry]
    while ready:  # callers before callees (HLO calls never recurse)
        name = ready.pop()
        for callee, runs in calls[name]:
            times[callee] += times[name] * runs
            waiting[callee] -= 1
            if not waiting[callee]:
                ready.append(callee)
    return times


@dataclasses.dataclass(frozen=True)
class StepPrediction:
    """The model's step-time range for one device of a compiled program, and every term behind
    it. ``lower_s`` and ``upper_s`` are the range's low and high ends (model numbers, not
    bounds on a GPU). Seconds throughout; ``flops`` is global (all devices), the times are
    per device.
    """

    gpu: str
    num_devices: int
    kernels: int
    flops: float
    math_s: float
    memory_s: float
    floor_s: float
    kernel_s: float
    collectives: int
    transfer_s: float
    latency_s: float
    exposed_s: float
    lower_s: float
    upper_s: float

    def rows(self) -> list[TermRow]:
        """The terms as table rows ``term, microseconds, how``, rounded to 2 digits."""

        def us(x: float) -> float:
            return round_sig(x * 1e6)

        return [
            {"term": "kernels", "us": self.kernels, "how": "launches per step (loops: x trips)"},
            {"term": "math", "us": us(self.math_s), "how": "sum of FLOPs / peak"},
            {"term": "memory", "us": us(self.memory_s), "how": "sum of HBM bytes / bandwidth"},
            {"term": "floors", "us": us(self.floor_s), "how": "kernels x floor"},
            {
                "term": "kernels back to back",
                "us": us(self.kernel_s),
                "how": "sum of max(floor, math, memory) per kernel",
            },
            {"term": "collectives", "us": self.collectives, "how": "calls per step"},
            {"term": "transfer", "us": us(self.transfer_s), "how": "sum of alpha + bytes / link"},
            {"term": "of which latency", "us": us(self.latency_s), "how": "collectives x alpha"},
            {
                "term": "exposed communication",
                "us": us(self.exposed_s),
                "how": "transfer not hidden by kernels between start and done",
            },
            {
                "term": RANGE_LOW,
                "us": us(self.lower_s),
                "how": "max(math, memory, exposed, floors)",
            },
            {"term": RANGE_HIGH, "us": us(self.upper_s), "how": "kernels back to back + exposed"},
        ]

    def tokens_per_s(self, tokens: int) -> tuple[float, float]:
        """``(low, high)`` tokens per second for a step of ``tokens`` tokens (2 digits)."""
        return round_sig(tokens / self.upper_s), round_sig(tokens / self.lower_s)


def formula() -> str:
    """The step model as text: what each end of the range adds up (the terms:
    :func:`overlap.formula`)."""
    return (
        "the kit's model (a range, not bounds: floor and alpha are guesses)\n"
        "kernel k:  t_k = max(floor, FLOPs_k / peak, bytes_k / HBM)\n"
        "low end  = max(sum FLOPs_k / peak, sum bytes_k / HBM, exposed comm, kernels x floor)\n"
        "high end = sum t_k + exposed comm\n"
        "exposed  = sum over collectives of (alpha + bytes / link) x (1 - hidden)"
    )


def predict(
    text: str,
    gpu: str | Hardware = "H100 SXM",
    link_gbps: float | None = None,
    latencies: Latencies = LATENCIES,
) -> StepPrediction:
    """The step-time range of a compiled program (``compiled.as_text()``) on ``gpu``."""
    hw = gpu if isinstance(gpu, Hardware) else hardware(gpu)
    module = parse_module(text)
    kernels = overlap.computation_cost(module, module.entry, hw, latencies)
    times = trip_multipliers(module)
    found = overlap.estimate(text, hw, link_gbps, latencies)
    exposed = sum((1 - e.hidden) * e.transfer_s * times.get(e.computation, 1) for e in found)
    transfer = sum(e.transfer_s * times.get(e.computation, 1) for e in found)
    latency = sum(e.latency_s * times.get(e.computation, 1) for e in found)
    lower = max(kernels.math_s, kernels.memory_s, exposed, kernels.floor_s)
    return StepPrediction(
        hw.name,
        module.num_devices or 1,
        kernels.kernels,
        hlo_flops(text),
        kernels.math_s,
        kernels.memory_s,
        kernels.floor_s,
        kernels.seconds,
        sum(times.get(e.computation, 1) for e in found),
        transfer,
        latency,
        exposed,
        lower,
        kernels.seconds + exposed,
    )


class SensitivityRow(TypedDict):
    """The model's range with its two guessed constants scaled: microseconds."""

    kernel_floor_us: float
    collective_us: float
    low_us: float
    high_us: float


def sensitivity(
    text: str,
    gpu: str | Hardware = "H100 SXM",
    factors: tuple[float, ...] = (1.0, 2.0, 4.0),
    latencies: Latencies = LATENCIES,
) -> list[SensitivityRow]:
    """The model's range when the per-kernel floor and the per-collective alpha are each
    scaled by every factor (both at once, then each alone): how much of the range the two
    guessed constants set. Rounded to two digits."""
    rows: list[SensitivityRow] = []
    seen = set()
    for kf, cf in (
        [(f, f) for f in factors] + [(f, 1.0) for f in factors] + [(1.0, f) for f in factors]
    ):
        floor, alpha = latencies.kernel_floor_us * kf, latencies.collective_us * cf
        if (floor, alpha) in seen:
            continue
        seen.add((floor, alpha))
        p = predict(
            text,
            gpu,
            latencies=dataclasses.replace(latencies, kernel_floor_us=floor, collective_us=alpha),
        )
        rows.append(
            {
                "kernel_floor_us": floor,
                "collective_us": alpha,
                "low_us": round_sig(p.lower_s * 1e6),
                "high_us": round_sig(p.upper_s * 1e6),
            }
        )
    return rows
