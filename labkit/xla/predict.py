"""Predict a compiled GPU program's step time as a range, with every term of the model shown.

An estimate read from the compiled program (nothing runs): each kernel costs
``max(floor, FLOPs / peak, bytes / HBM)`` and each collective ``alpha + bytes / link``, minus
what the kernels scheduled beside it hide (:mod:`labkit.xla.overlap`, whose docstring gives
the terms and their sources). For one device of an SPMD program:

- **lower bound** = ``max(math, memory, exposed communication, kernels x floor)``: the GPU
  cannot finish before its busiest resource does, nor launch its kernels faster than the
  floor allows;
- **upper bound** = ``sum over kernels of max(floor, math, memory) + exposed
  communication``: every kernel back to back, none overlapping another.

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
from labkit.xla.hlo_text import CALLEE_KEYS, Module, parse_module

__all__ = ["StepPrediction", "TermRow", "formula", "predict", "round_sig", "trip_multipliers"]


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
    """A step-time range for one device of a compiled program, and every term behind it.

    Seconds throughout; ``flops`` is global (all devices), the times are per device.
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
                "term": "lower bound",
                "us": us(self.lower_s),
                "how": "max(math, memory, exposed, floors)",
            },
            {
                "term": "upper bound",
                "us": us(self.upper_s),
                "how": "kernels back to back + exposed",
            },
        ]

    def tokens_per_s(self, tokens: int) -> tuple[float, float]:
        """``(low, high)`` tokens per second for a step of ``tokens`` tokens (2 digits)."""
        return round_sig(tokens / self.upper_s), round_sig(tokens / self.lower_s)


def formula() -> str:
    """The step model as text: what each bound adds up (the terms: :func:`overlap.formula`)."""
    return (
        "kernel k:  t_k = max(floor, FLOPs_k / peak, bytes_k / HBM)\n"
        "lower   = max(sum FLOPs_k / peak, sum bytes_k / HBM, exposed comm, kernels x floor)\n"
        "upper   = sum t_k + exposed comm\n"
        "exposed = sum over collectives of (alpha + bytes / link) x (1 - hidden)"
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
