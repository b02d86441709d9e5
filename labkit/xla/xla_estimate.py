"""XLA's own estimate of a compiled GPU program, read from its scheduler, beside the kit's model.

XLA:GPU's latency-hiding scheduler orders each program with a cost for every instruction and a
latency for every async transfer. Without a profile, on Hopper and Blackwell, those come from
XLA's unified "speed of light" estimator (openxla/xla
``xla/service/gpu/model/sol_latency_estimator.cc``, ``NodeCost`` and ``GetLatencyBetween``):

- a GEMM: the **matmul interpolator**, measured GEMM times per GPU generation interpolated by
  shape and types (``matmul_interpolator.cc``, tables in ``default_matmul_perf_table.txtpb``);
- a loop or input fusion: XLA's analytical **GPU performance model** (bytes and FLOPs at the
  device's rates; ``gpu_performance_model.cc``), with no per-kernel launch floor;
- any other kernel (a custom fusion such as a Triton softmax, a copy): a **fallback**, 0.01 x
  the approximate estimator's "T-shirt" cost (``kLowCost`` = 1, so 0.01 us);
- an async collective: the **collective interpolator**, measured NCCL times over NVLink by size
  and group (``collective_interpolator.cc``); its start and done cost 1 each (``kLowCost``);
- an async op it cannot cost (an async dynamic-slice fusion in a loop body): the approximate
  estimator's fixed ``kHighLatency`` = 5000 us (``latency_hiding_scheduler.h``).

:func:`compile_with_estimate` compiles a program with the schedule dump on
(:mod:`labkit.xla.xla_schedule`), keeps what it read in the kit's cache beside the compile, and
returns :class:`XlaEstimate`: every instruction's cost as XLA had it, each computation's length
(its ``total_cycles``: costs plus waits), and the step as XLA's model composes it: the entry
plus each loop body times its trip count (each body has its own schedule). :func:`compare`
sets it beside :func:`labkit.xla.predict.predict` term by term, :func:`disagreements` names
the kernels where the two differ most and why, :meth:`XlaEstimate.flagged` the values that are
fallback constants rather than estimates, and :class:`XlaModel` is XLA's estimate as a
:class:`labkit.xla.timeline.Source`. Neither model is a measurement.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from labkit.core.env import cache_dir
from labkit.core.hardware import Hardware, hardware
from labkit.core.types import CompilerOption, PyTree
from labkit.xla import compile_cache, hlo, overlap
from labkit.xla.compile_cache import StoredCompile
from labkit.xla.hlo_text import Instruction, Module, element_types, parse_module
from labkit.xla.predict import StepPrediction, predict, round_sig, trip_multipliers
from labkit.xla.timeline import KernelTime, TransferTime
from labkit.xla.xla_schedule import (
    ComputationSchedule,
    ScheduledOp,
    ScheduleDump,
    dump_options,
    read_folder,
)

if TYPE_CHECKING:
    from labkit.xla.aot import AotResult
    from labkit.xla.tiles import Tiles

__all__ = [
    "FALLBACKS",
    "FORMAT",
    "SOURCES",
    "OpEstimate",
    "TermPair",
    "XlaEstimate",
    "XlaModel",
    "compare",
    "compile_with_estimate",
    "disagreements",
    "estimate",
    "estimate_folder",
]

FORMAT = 1  # bump when what a stored estimate holds changes
LABEL = "XLA's model"
MATMUL, PERF_MODEL, FALLBACK = "matmul interpolator", "GPU performance model", "fallback"
COLLECTIVE, ASYNC_OP = "collective interpolator", "no model (async op)"
SOURCES: dict[str, str] = {
    MATMUL: "measured GEMM times per GPU generation, interpolated by shape and types",
    PERF_MODEL: "analytical: bytes and FLOPs at the device's rates, no launch floor",
    FALLBACK: "no model for this kernel: 0.01 x the approximate estimator's cost of 1",
    COLLECTIVE: "measured NCCL times over NVLink, interpolated by bytes and group size",
    ASYNC_OP: "an async op XLA cannot cost: the approximate estimator's fixed latency",
}
# Fixed values of XLA's approximate ("T-shirt") estimator, latency_hiding_scheduler.h:
# kLowCost = 1, kMediumCost = 1000, kHighCost = 5000, kHighLatency = 5000; the SOL estimator's
# fallback is 0.01 x its NodeCost (sol_latency_estimator.cc). A value equal to one of these is
# a constant, not an estimate.
FALLBACKS: dict[float, str] = {
    5000.0: "5000 us: the approximate estimator's kHighLatency/kHighCost, a constant",
    1000.0: "1000 us: the approximate estimator's kMediumCost (a T-shirt size), a constant",
    50.0: "50 us: 0.01 x kHighCost, the SOL estimator's fallback, a constant",
    10.0: "10 us: 0.01 x kMediumCost, the SOL estimator's fallback, a constant",
    0.01: "0.01 us: 0.01 x kLowCost, the SOL estimator's fallback, a constant",
}
_SCHEDULING_NAME = re.compile(r'scheduling_name="([^"]+)"')


def _fallback(us: float) -> str:
    return next((why for value, why in FALLBACKS.items() if abs(us - value) < 1e-6), "")


@dataclasses.dataclass(frozen=True)
class OpEstimate:
    """One kernel or transfer of the compiled program as XLA's scheduler costed it.

    ``us`` is XLA's time for one run (a kernel's cost; a transfer's start-to-done window),
    ``per_step`` the runs per step (loop bodies: their trips), ``source`` the part of XLA's
    model that gave it (a key of :data:`SOURCES`), ``flag`` why the value is a fixed
    constant rather than an estimate ("" for an estimate).
    """

    name: str
    computation: str
    kind: str  # "kernel" or "transfer"
    source: str
    us: float
    per_step: int
    flag: str = ""
    note: str = ""


@dataclasses.dataclass(frozen=True)
class XlaEstimate:
    """XLA's estimate of one compiled program (microseconds per step, one device).

    ``computations`` are the scheduled computations (:mod:`labkit.xla.xla_schedule`) with how
    often each runs per step (``per_step``); ``ops`` the program's compute kernels and
    transfers with XLA's times; ``unscheduled`` the computations with kernels that XLA's
    scheduler did not order (loop bodies with no async work): XLA's step has no time for them.
    """

    module: str
    estimator: str
    computations: dict[str, ComputationSchedule]
    per_step: dict[str, int]
    ops: tuple[OpEstimate, ...]
    unscheduled: tuple[str, ...] = ()

    @property
    def step_us(self) -> float:
        """The step by XLA's model: each scheduled computation's total times its runs."""
        return sum(c.total_us * self.per_step.get(n, 1) for n, c in self.computations.items())

    def _sum(self, kind: str) -> float:
        return sum(o.us * o.per_step for o in self.ops if o.kind == kind)

    @property
    def kernel_us(self) -> float:
        """Every compute kernel's cost, back to back, per step."""
        return self._sum("kernel")

    @property
    def transfer_us(self) -> float:
        """Every collective's window (start to done), per step."""
        return self._sum("transfer")

    @property
    def exposed_us(self) -> float:
        """The waits for collectives the schedule leaves (``*_wasted_cycles``), per step."""
        return sum(
            sum(c.wasted_us.values()) * self.per_step.get(n, 1)
            for n, c in self.computations.items()
        )

    @property
    def other_waits_us(self) -> float:
        """Waits for async ops that are no collective (an async fusion's), per step."""
        return sum(c.other_waits_us * self.per_step.get(n, 1) for n, c in self.computations.items())

    @property
    def other_ops_us(self) -> float:
        """What the scheduled computations cost besides kernels: async starts and dones
        (``kLowCost``, 1 us each), loops' own instructions, ops that launch nothing."""
        costs = sum(c.cost_us * self.per_step.get(n, 1) for n, c in self.computations.items())
        return max(0.0, costs - self.kernel_us)

    @property
    def kernels(self) -> int:
        """Compute kernels launched per step in the scheduled computations."""
        return sum(o.per_step for o in self.ops if o.kind == "kernel")

    def flagged(self) -> list[OpEstimate]:
        """The ops whose time is one of XLA's fixed fallback values (:data:`FALLBACKS`)."""
        return [o for o in self.ops if o.flag]

    def op(self, name: str) -> OpEstimate | None:
        """The op named ``name`` (a kernel, or a collective's start), or None."""
        return next((o for o in self.ops if o.name == name), None)

    def by_source(self) -> dict[str, tuple[int, float]]:
        """``source -> (ops per step, us per step)`` over kernels and transfers."""
        out: dict[str, tuple[int, float]] = {}
        for o in self.ops:
            n, us = out.get(o.source, (0, 0.0))
            out[o.source] = (n + o.per_step, us + o.us * o.per_step)
        return out


def _scheduled_name(inst: Instruction) -> str:
    found = _SCHEDULING_NAME.search(inst.attr("metadata") or "")
    return found.group(1) if found else inst.name


def _source(module: Module, inst: Instruction) -> str:
    """Which part of XLA's model costs ``inst`` (sol_latency_estimator.cc's NodeCost order)."""
    if inst.opcode == "fusion":
        config = inst.backend_config().get("fusion_backend_config") or {}
        if "gemm" in str(config.get("kind", "")):
            return MATMUL
        kind = inst.attr("kind") or ""
        return PERF_MODEL if kind in ("kLoop", "kInput") else FALLBACK
    target = inst.attr("custom_call_target") or ""
    if inst.opcode == "custom-call" and ("gemm" in target or "matmul" in target):
        return MATMUL
    return FALLBACK


WIDE_OUTPUT = (
    "{types}: a type XLA's measured GEMM table may lack; its fallback then scales m, k and n by "
    "the output's bytes (matmul_interpolator.cc): far slower than the same product to bf16"
)


def _wide_output(module: Module, inst: Instruction) -> str:
    """A note when a GEMM kernel's narrow operands write a wider output (bf16 x bf16 -> f32):
    measured here, XLA costs a 1024^3 one 25x its bf16-output twin."""
    dots = [
        i
        for c in inst.callees("calls")
        for i in module.computations.get(c, ())
        if i.opcode == "dot"
    ]
    if not dots:
        return ""
    shapes = module.shapes(dots[0].computation)
    ins = [element_types(shapes.get(o, ""))[:1] for o in dots[0].operands[:2]]
    out = element_types(inst.shape)[:1]
    if not all(ins) or not out or out[0] != "f32" or all(t[0] == "f32" for t in ins):
        return ""
    return WIDE_OUTPUT.format(types=f"{ins[0][0]} x {ins[1][0]} -> {out[0]}")


def _estimator(ops: Sequence[OpEstimate]) -> str:
    kernels = [o.us for o in ops if o.kind == "kernel"]
    if kernels and all(
        any(abs(us - v) < 1e-9 for v in (0.0, 1.0, 1000.0, 5000.0)) for us in kernels
    ):
        return "approximate estimator (T-shirt sizes)"
    return "unified SOL estimator"


def _sequential(module: Module) -> set[str]:
    """The computations that run as a sequence of kernels (XLA schedules each on its own):
    the entry, loop bodies and conditions, called computations and conditional branches."""
    out = {module.entry}
    for insts in module.computations.values():
        for inst in insts:
            if inst.opcode == "while":
                out |= set(inst.callees("body", "condition"))
            elif inst.opcode == "call":
                out |= set(inst.callees("to_apply"))
            elif inst.opcode == "conditional":
                keys = ("branch_computations", "true_computation", "false_computation")
                out |= set(inst.callees(*keys))
    return out


def estimate(dump: ScheduleDump, text: str) -> XlaEstimate:
    """XLA's estimate of the compiled program ``text`` (``compiled.as_text()``) from the
    schedule dump of the same compile: ops matched by name (or the ``scheduling_name`` XLA
    keeps in their metadata)."""
    module = parse_module(text)
    times = trip_multipliers(module)
    ops: list[OpEstimate] = []
    transfers = {c.name for c in hlo.collectives(text)}
    sequential = _sequential(module)
    unscheduled = []
    for comp, insts in module.computations.items():
        kernels = {i.name for i in insts if hlo.is_compute(module, i) and i.opcode != "while"}
        sched = dump.computations.get(comp)
        if sched is None:
            if comp in sequential and kernels and times.get(comp):
                unscheduled.append(comp)
            continue
        runs = times.get(comp, 1)
        for inst in insts:
            scheduled = sched.op(inst.name) or sched.op(_scheduled_name(inst))
            if scheduled is None:
                continue
            if inst.name in transfers:
                ops.append(_transfer(inst, scheduled, comp, runs))
            elif inst.name in kernels:
                source = _source(module, inst)
                us = scheduled.cost_us
                note = _wide_output(module, inst) if source == MATMUL else ""
                op = OpEstimate(inst.name, comp, "kernel", source, us, runs, _fallback(us), note)
                ops.append(op)
    for comp, sched in dump.computations.items():  # async ops that are no collective
        for sop in sched.ops:
            window = sop.window_us
            if window is not None and sop.name not in transfers and _fallback(window):
                runs = times.get(comp, 1)
                flag = _fallback(window)
                ops.append(OpEstimate(sop.name, comp, "async", ASYNC_OP, window, runs, flag))
    return XlaEstimate(
        dump.module, _estimator(ops), dict(dump.computations), times, tuple(ops), tuple(unscheduled)
    )


AT_MOST = "at most: the schedule's placement, not the transfer's latency, sets a window this short"


def _transfer(inst: Instruction, op: ScheduledOp, comp: str, runs: int) -> OpEstimate:
    us = op.window_us if op.window_us is not None else op.cost_us
    note = AT_MOST if op.window_us is not None and op.window_us <= 2.0 + 1e-9 else ""
    return OpEstimate(inst.name, comp, "transfer", COLLECTIVE, us, runs, _fallback(us), note)


def estimate_folder(folder: str | Path, text: str) -> XlaEstimate | None:
    """:func:`estimate` from an XLA dump folder (None: XLA's scheduler wrote no schedule)."""
    dump = read_folder(folder, parse_module(text).name)
    return None if dump is None else estimate(dump, text)


# ---------------------------------------------------------------------------------------
# Compiling with the dump on, and keeping what it said


def _estimates_folder() -> Path:
    return cache_dir() / "xla-estimates"


def _store(digest: str, dump: ScheduleDump | None) -> None:
    data: dict[str, object] = {"module": None}
    if dump is not None:
        data = {
            "module": dump.module,
            "cycles_per_us": dump.cycles_per_us,
            "computations": {
                name: {
                    "ops": [dataclasses.astuple(op) for op in c.ops],
                    "total_us": c.total_us,
                    "wasted_us": c.wasted_us,
                }
                for name, c in dump.computations.items()
            },
        }
    compile_cache.write_entry(_estimates_folder() / f"{digest}.json.z", data)


def _load(digest: str) -> tuple[bool, ScheduleDump | None]:
    """``(found, dump)``: a stored reading (its dump None when XLA wrote no schedule)."""
    try:
        data = compile_cache.read_entry(_estimates_folder() / f"{digest}.json.z")
        if data["module"] is None:
            return True, None
        computations = {
            name: ComputationSchedule(
                name,
                tuple(ScheduledOp(n, o, tuple(ops), s, e, w) for n, o, ops, s, e, w in c["ops"]),
                float(c["total_us"]),
                {str(k): float(v) for k, v in c["wasted_us"].items()},
            )
            for name, c in data["computations"].items()
        }
        return True, ScheduleDump(data["module"], computations, float(data["cycles_per_us"]))
    except (OSError, ValueError, KeyError, TypeError, zlib.error):
        return False, None


def compile_with_estimate(
    fn: Callable[..., object],
    *args: PyTree,
    compiler_options: Mapping[str, CompilerOption | bytes] | None = None,
    tiles: Tiles | None = None,
) -> tuple[AotResult, XlaEstimate | None]:
    """Compile ``fn`` for compile-only GPUs (:func:`labkit.xla.aot.compile_for_gpu`) and read
    XLA's estimate of the program from its scheduler's dump (None when the scheduler had
    nothing to order: a program without async collectives).

    The dump leaves the program as it is. What was read is kept in the kit's cache
    (``$LABKIT_CACHE_DIR/xla-estimates``) under the compile's key, and the compile itself in
    the compile cache, so a repeated call in any process compiles nothing.
    """
    import jax

    from labkit.xla.aot import compile_for_gpu
    from labkit.xla.tiles import cache_marker, default_tiles

    chosen = default_tiles() if tiles is None else tiles
    options = dict(compiler_options or {})
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    digest = keyed = None
    if compile_cache.enabled() and not compile_cache.dumps_files(options):
        lowered = jitted.lower(*args)
        devices = sorted(
            {
                d
                for x in jax.tree.leaves(args)
                if (s := getattr(x, "sharding", None))
                for d in s.device_set
            },
            key=lambda d: d.id,
        )
        keyed = compile_cache.key(lowered, {**options, **cache_marker(chosen)}, devices)
        marker = {**options, **cache_marker(chosen), "labkit xla estimate": FORMAT}
        digest = compile_cache.key(lowered, marker, devices)
        found, dump = _load(digest)
        if found:
            result = compile_for_gpu(jitted, *args, compiler_options=options, tiles=chosen)
            return result, None if dump is None else estimate(dump, result.hlo)
    with tempfile.TemporaryDirectory(prefix="labkit-lhs-") as folder:
        dumped = {**options, **dump_options(folder)}
        result = compile_for_gpu(jitted, *args, compiler_options=dumped, tiles=chosen)
        dump = read_folder(folder, parse_module(result.hlo).name)
    if digest is not None and keyed is not None:
        _store(digest, dump)
        compiled = result.compiled
        if not isinstance(compiled, StoredCompile) and compile_cache.load(keyed) is None:
            compile_cache.store(keyed, compiled, result.hlo, result.seconds)
    return result, None if dump is None else estimate(dump, result.hlo)


# ---------------------------------------------------------------------------------------
# Beside the kit's model


class TermPair(TypedDict):
    """One term of the step, by the kit's model and by XLA's, in microseconds (counts for
    ``kernels`` and ``collectives``), and why they differ."""

    term: str
    kit: float | str
    xla: float | str
    why: str


def _kit_costs(text: str, hw: Hardware) -> dict[str, float]:
    """The kit's seconds per run of every compute kernel, by name."""
    module = parse_module(text)
    return {
        i.name: overlap.kernel_cost(module, i, hw).seconds
        for insts in module.computations.values()
        for i in insts
        if hlo.is_compute(module, i) and i.opcode not in ("while", "call", "conditional")
    }


def _rounded_us(us: float) -> float:
    """``us`` to two digits, with float noise from summed schedule times (under 1 ps) as 0."""
    return 0.0 if abs(us) < 1e-6 else round_sig(us)


def compare(
    text: str,
    est: XlaEstimate,
    gpu: str | Hardware = "H100 SXM",
    pred: StepPrediction | None = None,
) -> list[TermPair]:
    """The step's terms by the kit's model (:func:`labkit.xla.predict.predict`) and by XLA's
    (:class:`XlaEstimate`), side by side, rounded to two digits; kernels split by the part of
    XLA's model that costs them."""
    hw = gpu if isinstance(gpu, Hardware) else hardware(gpu)
    pred = pred or predict(text, hw)
    kit = _kit_costs(text, hw)
    rows: list[TermPair] = [
        {
            "term": "kernels",
            "kit": pred.kernels,
            "xla": est.kernels,
            "why": "the same program; XLA counts the computations its scheduler ordered",
        },
        {
            "term": "per-kernel floor",
            "kit": round_sig(pred.floor_s * 1e6),
            "xla": 0.0,
            "why": "the kit charges every kernel at least 1 us; XLA's scheduler costs have no "
            "launch floor",
        },
    ]
    for source in (MATMUL, PERF_MODEL, FALLBACK):
        mine = [o for o in est.ops if o.kind == "kernel" and o.source == source]
        if not mine:
            continue
        kit_us = sum(kit.get(o.name, 0.0) * o.per_step for o in mine) * 1e6
        rows.append(
            {
                "term": f"{sum(o.per_step for o in mine)} kernels by XLA's {source}",
                "kit": round_sig(kit_us),
                "xla": round_sig(sum(o.us * o.per_step for o in mine)),
                "why": f"XLA: {SOURCES[source]}; kit: max(floor, FLOPs / peak, bytes / HBM)",
            }
        )
    rows += [
        {
            "term": "kernels back to back",
            "kit": round_sig(pred.kernel_s * 1e6),
            "xla": round_sig(est.kernel_us),
            "why": "the sum of the rows by XLA's models above (each shown to 2 figures)",
        },
        {
            "term": "collectives",
            "kit": pred.collectives,
            "xla": sum(o.per_step for o in est.ops if o.kind == "transfer"),
            "why": "calls per step",
        },
        {
            "term": "transfer",
            "kit": round_sig(pred.transfer_s * 1e6),
            "xla": round_sig(est.transfer_us),
            "why": f"XLA: {SOURCES[COLLECTIVE]}; kit: 5 us + ring bytes / link",
        },
        {
            "term": "exposed communication",
            "kit": round_sig(pred.exposed_s * 1e6),
            "xla": round_sig(est.exposed_us),
            "why": "the transfer no kernel hides: each model with its own kernel and transfer "
            "times",
        },
        {
            "term": "async starts, dones and other ops",
            "kit": 0.0,
            "xla": _rounded_us(est.other_ops_us),
            "why": "XLA charges 1 us to each async start and done; the kit nothing",
        },
        {
            "term": "waits for other async ops",
            "kit": 0.0,
            "xla": _rounded_us(est.other_waits_us),
            "why": "async fusions and copies: the kit counts none; XLA waits its constant",
        },
        {
            "term": "step",
            "kit": f"{round_sig(pred.lower_s * 1e6):g}-{round_sig(pred.upper_s * 1e6):g}",
            "xla": round_sig(est.step_us),
            "why": "kit: the model's range; XLA: its scheduler's total (entry + trips x loop "
            "bodies)",
        },
    ]
    return rows


def disagreements(
    text: str, est: XlaEstimate, gpu: str | Hardware = "H100 SXM", top: int = 5
) -> list[dict[str, str | float]]:
    """The ``top`` kernels and transfers whose per-step times differ most between the two
    models: name, what XLA's model used, both times (us per step) and why."""
    hw = gpu if isinstance(gpu, Hardware) else hardware(gpu)
    kit = _kit_costs(text, hw)
    kit_moves = {e.name: e.transfer_s for e in overlap.estimate(text, hw)}
    found: list[tuple[float, float, OpEstimate]] = []
    for o in est.ops:
        mine = (kit_moves if o.kind == "transfer" else kit).get(o.name, 0.0) * 1e6 * o.per_step
        found.append((mine, o.us * o.per_step, o))
    found.sort(key=lambda f: -abs(f[1] - f[0]))
    return [
        {
            "op": o.name,
            "xla model": o.source,
            "kit us": round_sig(mine),
            "xla us": round_sig(xla),
            "why": o.flag or o.note or SOURCES[o.source],
        }
        for mine, xla, o in found[:top]
    ]


# ---------------------------------------------------------------------------------------
# As a timeline source


class XlaModel:
    """XLA's estimate as a :class:`labkit.xla.timeline.Source`: each kernel's cost and each
    collective's start-to-done window as XLA's scheduler had them (0 for a kernel XLA did not
    schedule). FLOPs and bytes are the kit's count, for the picture's hover text."""

    def __init__(self, text: str, est: XlaEstimate, gpu: str | Hardware = "H100 SXM") -> None:
        self.module = parse_module(text)
        self.est = est
        self.hw = gpu if isinstance(gpu, Hardware) else hardware(gpu)
        self._ops = {(o.computation, o.name): o for o in est.ops}
        self._moves = {c.name: c for c in hlo.collectives(text)}

    @property
    def name(self) -> str:
        """The source, as the pictures name it."""
        return f"{LABEL} ({self.est.estimator}, {self.hw.name})"

    def kernel(self, inst: Instruction) -> KernelTime:
        """XLA's cost of one kernel, and which part of its model gave it."""
        cost = overlap.kernel_cost(self.module, inst, self.hw)
        op = self._ops.get((inst.computation, inst.name))
        if op is None:
            return KernelTime(0.0, cost.flops, cost.hbm_bytes, "not scheduled by XLA")
        return KernelTime(op.us * 1e-6, cost.flops, cost.hbm_bytes, op.source)

    def transfer(self, inst: Instruction) -> TransferTime | None:
        """XLA's window of one collective (None for anything else)."""
        move = self._moves.get(inst.name)
        op = self._ops.get((inst.computation, inst.name))
        if move is None:
            return None
        seconds = 0.0 if op is None else op.us * 1e-6
        return TransferTime(seconds, move.kind, move.bytes, 0.0, 0.0, seconds)
