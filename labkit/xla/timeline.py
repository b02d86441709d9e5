"""The H100 step as a timeline: every kernel and collective of a compiled program, placed in time.

Modelled, not measured: nothing runs. A :class:`Source` says how long each kernel and each
transfer takes; :class:`KitModel`, the kit's model (:mod:`labkit.xla.overlap`: per-kernel
``max(floor, FLOPs / peak, bytes / HBM)``, per-collective ``alpha + bytes / link``), is the
first source; :class:`labkit.xla.xla_estimate.XlaModel`, XLA's own estimate read from its
latency-hiding scheduler's dump, is the second. Another estimate plugs in as another
:class:`Source` answering by instruction. :func:`build` then plays the compiled program's
schedule (its text order, :mod:`labkit.xla.hlo`) as a list schedule:

- the **compute** lane runs the scheduled kernels one after another (XLA:GPU launches a
  program's kernels in order on its compute stream), each for the source's kernel time;
- an **async collective** is launched at its ``-start`` on its stream's lane, as soon as that
  stream is free (a stream runs its collectives one after another; here all collectives share
  one stream and send/recv another: an assumption of this model), and runs for its transfer
  time. Its ``-done`` makes the compute lane wait until the transfer ends. The part of the
  transfer that runs while kernels still run is **hidden**; the part the compute lane waits
  for is **exposed**. A bracket over the lane shows its window, from start to done;
- a **synchronous** collective blocks the compute lane for its whole transfer (all exposed);
- a **loop** with a known trip count runs its body that many times: unrolled up to
  ``unroll`` trips, else its first iteration is drawn and the rest folded into one span of
  ``trips - 1`` times the first's length (totals count every trip). A loop whose trip count
  XLA does not know runs once, as the model counts it; a conditional runs its longest branch;
  a call runs its computation. Async ops that are not collectives (async fusions, copies) get
  no time: the kit's model counts no kernel for them.

Where the schedule keeps at most one collective in flight (what XLA's latency-hiding scheduler
does by default), each transfer's hidden part is :func:`labkit.xla.overlap.estimate`'s and the
step is the high end of :func:`labkit.xla.predict.predict`'s range. Where several are in
flight (the scheduler off), the lanes show what the model's per-collective sums cannot: a
transfer queued behind another, and a wait for one that hides the next.

:func:`picture` draws timelines one above the other on one time axis (:mod:`labkit.core.lanes`);
:mod:`labkit.xla.trace_events` writes them as Chrome / Perfetto trace-event JSON and reads a
measured ``jax.profiler`` trace back as a :class:`Timeline` (drawn on the same scale).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Protocol, TypedDict

from labkit.core.figures import Picture
from labkit.core.hardware import LATENCIES, Hardware, Latencies, hardware
from labkit.core.lanes import Bar, Bracket, Panel, Style, render
from labkit.xla import hlo, overlap
from labkit.xla.hlo_text import Instruction, Module, parse_module, shape_bytes, split_top_level
from labkit.xla.predict import round_sig

__all__ = [
    "COMPUTE",
    "MODELLED",
    "STYLES",
    "KernelTime",
    "KitModel",
    "Source",
    "Span",
    "Timeline",
    "Totals",
    "TransferTime",
    "build",
    "picture",
    "stream_of",
    "summary_rows",
]

MODELLED = "modelled, not measured"
COMPUTE = "compute"
COLLECTIVE_STREAM = "collective stream"
P2P_STREAM = "send/recv stream"
UNROLL = 4  # loops of at most this many trips are drawn trip by trip; longer ones are folded

type Arg = str | int | float

STYLES: dict[str, Style] = {
    "kernel": Style("#4e79a7", "kernel"),
    "matmul": Style("#1f3a68", "kernel with a matmul"),
    "wait": Style("#9c9c9c", "compute waits (exposed transfer)", hatch=True),
    "hidden": Style("#59a14f", "transfer, hidden"),
    "exposed": Style("#e15759", "transfer, exposed", hatch=True),
    "sync": Style("#b07aa1", "synchronous collective (exposed)", hatch=True),
    "folded": Style("#d9d9d9", "folded loop iterations", text="#333"),
    "measured": Style("#f28e2b", "measured kernel"),
}


@dataclasses.dataclass(frozen=True)
class KernelTime:
    """What a source says one kernel costs: seconds, and the FLOPs and HBM bytes behind them."""

    seconds: float
    flops: float = 0.0
    hbm_bytes: float = 0.0
    bound: str = ""  # which term set the time: "floor", "math" or "memory" (the kit's model)


@dataclasses.dataclass(frozen=True)
class TransferTime:
    """What a source says one collective's transfer costs, and its terms."""

    seconds: float
    kind: str
    bytes: int
    link_bytes: float = 0.0
    latency_s: float = 0.0
    wire_s: float = 0.0


class Source(Protocol):
    """Where a timeline's durations come from (the kit's model; later, XLA's own estimate)."""

    @property
    def name(self) -> str:
        """Who estimated the times, e.g. "the kit's model (H100 SXM)"."""
        ...

    def kernel(self, inst: Instruction) -> KernelTime:
        """The time of one compute kernel (an instruction :func:`hlo.is_compute` accepts)."""
        ...

    def transfer(self, inst: Instruction) -> TransferTime | None:
        """The transfer of a collective (its op, or its ``-start``); None for anything else."""
        ...


class KitModel:
    """The kit's model as a :class:`Source`: :mod:`labkit.xla.overlap`'s kernel times
    (:func:`overlap.kernel_cost`) and transfer times (``alpha + bytes sent / link``, the
    transfer of :func:`overlap.estimate`) for ``gpu``, a hardware-table name or entry."""

    def __init__(
        self,
        text: str,
        gpu: str | Hardware = "H100 SXM",
        link_gbps: float | None = None,
        latencies: Latencies = LATENCIES,
    ) -> None:
        self.module = parse_module(text)
        self.hw = gpu if isinstance(gpu, Hardware) else hardware(gpu)
        self.latencies = latencies
        self.link_gbps = link_gbps or (self.hw.nvlink_gbps or 0.0) / 2
        if self.link_gbps <= 0:
            raise ValueError(
                f"{self.hw.name} has no NVLink figure: pass link_gbps= (GB/s, one way)"
            )
        self._transfers: dict[str, TransferTime] = {}
        for c in hlo.collectives(text):
            self._add(c.name, c.kind, c.bytes, c.group_size or self.module.num_devices)
        by_name = {i.name: i for i in hlo.instructions(text)}
        for p in hlo.async_pairs(text):
            if p.kind in ("send", "recv"):  # (data, u32[], token[])
                data = split_top_level(by_name[p.start].shape[1:-1])[0]
                self._add(p.start, p.kind, shape_bytes(data), 2)

    def _add(self, name: str, kind: str, nbytes: int, group: int | None) -> None:
        moved = overlap.link_bytes(kind, nbytes, group)
        alpha = self.latencies.collective_us * 1e-6 if moved > 0 else 0.0
        wire = moved / (self.link_gbps * 1e9)
        self._transfers[name] = TransferTime(alpha + wire, kind, nbytes, moved, alpha, wire)

    @property
    def name(self) -> str:
        """The source, as the pictures and the trace name it."""
        return f"the kit's model ({self.hw.name})"

    def kernel(self, inst: Instruction) -> KernelTime:
        """``max(floor, FLOPs / peak, bytes / HBM)`` (:func:`overlap.kernel_cost`)."""
        cost = overlap.kernel_cost(self.module, inst, self.hw, self.latencies)
        terms = {"floor": cost.floor_s, "math": cost.math_s, "memory": cost.memory_s}
        bound = max(terms, key=terms.__getitem__)
        return KernelTime(cost.seconds, cost.flops, cost.hbm_bytes, bound)

    def transfer(self, inst: Instruction) -> TransferTime | None:
        """``alpha + bytes sent / link`` of a collective (as :func:`overlap.estimate` costs
        it), or None when ``inst`` is no collective."""
        return self._transfers.get(inst.name)


@dataclasses.dataclass(frozen=True)
class Span:
    """One interval on one lane, in seconds from the step's start.

    ``kind``: "kernel", "matmul", "wait" (compute waits for a transfer), "transfer" (an async
    collective's transfer, launch to end), "sync" (a synchronous one), "window" (an async
    collective's start to done), "loop", "folded" (loop iterations not drawn one by one) or
    "measured". ``repeat`` is how many times the step runs it (a span in a folded loop's first
    iteration: the loop's trips). ``args`` are what a hover and the trace show.
    """

    lane: str
    name: str
    kind: str
    start_s: float
    end_s: float
    args: Mapping[str, Arg] = dataclasses.field(default_factory=dict)
    repeat: int = 1

    @property
    def seconds(self) -> float:
        """The span's length."""
        return self.end_s - self.start_s


class Totals(TypedDict):
    """A timeline's numbers per step (folded loop iterations included), microseconds."""

    step_us: float
    kernels: int
    matmul_kernels: int
    kernel_us: float
    collectives: int
    async_collectives: int
    sync_collectives: int
    transfer_us: float
    hidden_us: float
    exposed_us: float
    hidden: int
    partly_hidden: int
    exposed: int


@dataclasses.dataclass(frozen=True)
class Timeline:
    """Spans on lanes: a compiled program as a source times it (or a measured trace)."""

    title: str
    source: str
    measured: bool
    lanes: tuple[str, ...]
    spans: tuple[Span, ...]
    loops: tuple[str, ...] = ()  # how each loop was drawn, e.g. "while.3: 4 trips, unrolled"

    @property
    def end_s(self) -> float:
        """Where the last span ends: the step's length on this timeline."""
        return max((s.end_s for s in self.spans), default=0.0)

    def of(self, *kinds: str) -> list[Span]:
        """The spans of these kinds, in time order."""
        return sorted((s for s in self.spans if s.kind in kinds), key=lambda s: s.start_s)

    def totals(self) -> Totals:
        """Per-step numbers: kernels, collectives, transfer hidden and exposed (us)."""
        kernels = self.of("kernel", "matmul", "measured")
        moves = self.of("transfer", "sync")
        verdicts = Counter(_verdict(s) for s in moves for _ in range(s.repeat))
        return {
            "step_us": self.end_s * 1e6,
            "kernels": sum(s.repeat for s in kernels),
            "matmul_kernels": sum(s.repeat for s in kernels if s.kind == "matmul"),
            "kernel_us": sum(s.seconds * s.repeat for s in kernels) * 1e6,
            "collectives": sum(s.repeat for s in moves),
            "async_collectives": sum(s.repeat for s in moves if s.kind == "transfer"),
            "sync_collectives": sum(s.repeat for s in moves if s.kind == "sync"),
            "transfer_us": sum(s.seconds * s.repeat for s in moves) * 1e6,
            "hidden_us": sum(float(s.args.get("hidden_us", 0)) * s.repeat for s in moves),
            "exposed_us": sum(float(s.args.get("exposed_us", 0)) * s.repeat for s in moves),
            "hidden": verdicts["hidden"],
            "partly_hidden": verdicts["partly hidden"],
            "exposed": verdicts["exposed"],
        }

    def caption(self) -> str:
        """One line with the numbers the picture shows (rounded to two digits: a model)."""
        t = self.totals()

        def us(x: float) -> str:
            return f"{round_sig(x):g} us"

        head = f"{self.title}: {us(t['step_us'])} per step, "
        head += "measured" if self.measured else f"{MODELLED} ({self.source})"
        if self.measured:
            return f"{head}; {_count(t['kernels'], 'kernel')}, {us(t['kernel_us'])} busy"
        text = (
            f"{head}; {_count(t['kernels'], 'kernel')} ({t['matmul_kernels']} with matmuls) "
            f"{us(t['kernel_us'])}; {_count(t['collectives'], 'collective')} "
            f"({t['async_collectives']} async, {t['sync_collectives']} sync): transfer "
            f"{us(t['transfer_us'])}, "
            f"{us(t['hidden_us'])} hidden, {us(t['exposed_us'])} exposed ({t['hidden']} "
            f"hidden, {t['partly_hidden']} partly hidden, {t['exposed']} exposed)"
        )
        return text + (f"; loops: {'; '.join(self.loops)}" if self.loops else "")

    def panel(self, marks: Mapping[str, str] | None = None) -> Panel:
        """This timeline as a :class:`labkit.core.lanes.Panel` (what :func:`picture` draws);
        ``marks`` names spans to point out (an op name -> a short label drawn over it)."""
        marks = marks or {}
        bars: list[Bar] = []
        brackets: list[Bracket] = []
        levels = _levels(self.spans, ("window", "loop"))
        for k, s in enumerate(self.spans):
            tip = _tooltip(s)
            if s.kind in ("window", "loop"):
                at = (s.start_s * 1e6, s.end_s * 1e6)
                label, strong = marks.get(s.name, s.name), s.name in marks
                brackets.append(Bracket(s.lane, *at, label, tip, levels[k], strong))
            elif s.kind == "sync" and s.name in marks:
                at = (s.start_s * 1e6, s.end_s * 1e6)
                brackets.append(Bracket(s.lane, *at, marks[s.name], tip, 0, True))
                bars.append(Bar(s.lane, *at, s.kind, s.name, tip))
            elif s.kind == "transfer":
                cut = s.start_s + float(s.args.get("hidden_us", 0)) * 1e-6
                bars.append(Bar(s.lane, s.start_s * 1e6, cut * 1e6, "hidden", "", tip))
                bars.append(Bar(s.lane, cut * 1e6, s.end_s * 1e6, "exposed", "", tip))
            else:
                bars.append(Bar(s.lane, s.start_s * 1e6, s.end_s * 1e6, s.kind, s.name, tip))
        kept = [b for b in bars if b.end > b.start]
        tag = "measured" if self.measured else f"{MODELLED}, {self.source}"
        return Panel(f"{self.title} ({tag})", self.lanes, tuple(kept), tuple(brackets))

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, str]:
        return picture(self)._repr_mimebundle_()


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _levels(spans: Sequence[Span], kinds: tuple[str, ...]) -> dict[int, int]:
    """A level for each span of ``kinds`` (by position in ``spans``): the lowest one free on
    its lane, so brackets that overlap in time stack instead of hiding each other."""
    ends: dict[str, list[float]] = {}
    out: dict[int, int] = {}
    chosen = [k for k, s in enumerate(spans) if s.kind in kinds]
    order = sorted(chosen, key=lambda k: (spans[k].start_s, -spans[k].end_s))
    for k in order:
        span = spans[k]
        lane = ends.setdefault(span.lane, [])
        level = next((i for i, end in enumerate(lane) if end <= span.start_s + 1e-12), len(lane))
        if level == len(lane):
            lane.append(span.end_s)
        lane[level] = span.end_s
        out[k] = level
    return out


def _verdict(span: Span) -> str:
    if span.kind == "sync":
        return "exposed"
    hidden = float(span.args.get("hidden_us", 0)) * 1e-6
    fraction = hidden / span.seconds if span.seconds > 0 else 1.0
    if fraction < overlap.EXPOSED_BELOW:
        return "exposed"
    return "hidden" if float(span.args.get("exposed_us", 0)) <= 1e-9 else "partly hidden"


def _fmt(value: Arg) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _tooltip(span: Span) -> str:
    lines = [f"{span.name} ({span.kind}): {span.seconds * 1e6:.4g} us"]
    lines += [f"{k}: {_fmt(v)}" for k, v in span.args.items()]
    if span.repeat > 1:
        lines.append(f"runs {span.repeat} times per step")
    return "\n".join(lines)


def stream_of(kind: str) -> str:
    """The lane of a collective of ``kind``: send/recv on their own stream, the rest on one."""
    return P2P_STREAM if kind in ("send", "recv") else COLLECTIVE_STREAM


@dataclasses.dataclass
class _InFlight:
    """An async transfer between its start and its done."""

    inst: Instruction
    move: TransferTime
    lane: str
    start_s: float  # when the start was reached
    launch_s: float  # when its stream began it
    end_s: float
    repeat: int


class _Player:
    """Plays a module's schedule with a source's times (see the module docstring)."""

    def __init__(
        self, module: Module, source: Source, unroll: int, async_starts: Mapping[str, str]
    ) -> None:
        self.module = module
        self.source = source
        self.unroll = unroll
        self.async_starts = async_starts  # start name -> done name, async pairs only
        self.spans: list[Span] = []
        self.free: dict[str, float] = {}  # stream lane -> when it is free
        self.in_flight: dict[str, _InFlight] = {}  # done name -> transfer
        self.loops: list[str] = []
        self.repeat = 1

    def run(self, name: str, t: float) -> float:
        """Play computation ``name`` from time ``t``; returns when its last op ends."""
        for inst in self.module.computations.get(name, ()):
            t = self.step(inst, t)
        for done, moving in list(self.in_flight.items()):  # its done is in another iteration
            if moving.inst.computation == name:
                del self.in_flight[done]
                self.finish(moving, moving.end_s, waited=False)
        return t

    def step(self, inst: Instruction, t: float) -> float:
        move = self.source.transfer(inst)
        if move is not None:
            return self.launch(inst, move, t)
        if inst.name in self.in_flight:
            moving = self.in_flight.pop(inst.name)
            self.finish(moving, t, waited=True)
            return max(t, moving.end_s)
        if inst.opcode == "while":
            return self.loop(inst, t)
        if inst.opcode == "call":
            return self.run(inst.callees("to_apply")[0], t) if inst.callees("to_apply") else t
        if inst.opcode == "conditional":
            return self.branch(inst, t)
        if not hlo.is_compute(self.module, inst):
            return t
        k = self.source.kernel(inst)
        if k.seconds <= 0:
            return t
        args: dict[str, Arg] = {
            "opcode": inst.opcode,
            "modelled_us": k.seconds * 1e6,
            "flops": k.flops,
            "hbm_bytes": k.hbm_bytes,
        }
        if kind := (inst.attr("kind") or ""):
            args["fusion_kind"] = kind
        if k.bound:
            args["bound_by"] = k.bound
        style = "matmul" if k.flops > 0 else "kernel"
        self.spans.append(Span(COMPUTE, inst.name, style, t, t + k.seconds, args, self.repeat))
        return t + k.seconds

    def launch(self, inst: Instruction, move: TransferTime, t: float) -> float:
        lane = stream_of(move.kind)
        begin = max(t, self.free.get(lane, 0.0))
        end = begin + move.seconds
        self.free[lane] = end
        done = self.async_starts.get(inst.name)
        if done is not None:
            self.in_flight[done] = _InFlight(inst, move, lane, t, begin, end, self.repeat)
            return t
        args = self.transfer_args(move, 0.0, end - t)
        args["mode"] = "sync"
        self.spans.append(Span(lane, inst.name, "sync", begin, end, args, self.repeat))
        if end > t:
            wait: dict[str, Arg] = {"waits_for": inst.name, "exposed_us": (end - t) * 1e6}
            self.spans.append(Span(COMPUTE, f"wait {inst.name}", "wait", t, end, wait, self.repeat))
        return end

    def transfer_args(self, move: TransferTime, hidden: float, exposed: float) -> dict[str, Arg]:
        return {
            "collective": move.kind,
            "bytes": move.bytes,
            "link_bytes": move.link_bytes,
            "latency_us": move.latency_s * 1e6,
            "wire_us": move.wire_s * 1e6,
            "modelled_us": move.seconds * 1e6,
            "hidden_us": hidden * 1e6,
            "exposed_us": exposed * 1e6,
        }

    def finish(self, moving: _InFlight, reached: float, waited: bool) -> None:
        """Record a transfer whose done is reached at ``reached`` (the compute lane's time)."""
        cut = min(moving.end_s, max(reached, moving.launch_s))
        hidden, exposed = cut - moving.launch_s, moving.end_s - cut
        args = self.transfer_args(moving.move, hidden, exposed)
        args |= {"mode": "async", "queued_us": (moving.launch_s - moving.start_s) * 1e6}
        if not waited:
            args["done"] = "in another iteration: not waited for"
        name, lane, rep = moving.inst.name, moving.lane, moving.repeat
        self.spans.append(Span(lane, name, "transfer", moving.launch_s, moving.end_s, args, rep))
        done_at = max(reached, moving.end_s) if waited else moving.end_s
        window = {"start_us": moving.start_s * 1e6, "done_us": done_at * 1e6}
        self.spans.append(Span(lane, name, "window", moving.start_s, done_at, window, rep))
        if waited and exposed > 0:
            wait: dict[str, Arg] = {"waits_for": name, "exposed_us": exposed * 1e6}
            self.spans.append(Span(COMPUTE, f"wait {name}", "wait", cut, moving.end_s, wait, rep))

    def loop(self, inst: Instruction, t: float) -> float:
        body = inst.callees("body")
        if not body:
            return t
        trips = inst.trip_count
        n = 1 if trips is None else trips
        start = t
        if n <= self.unroll:
            for _ in range(n):
                t = self.run(body[0], t)
            how = (
                f"{inst.name}: {n} trips, unrolled"
                if trips is not None
                else (f"{inst.name}: trip count unknown, run once (as the model counts it)")
            )
        else:
            outer, drawn = self.repeat, len(self.spans)
            self.repeat = outer * n
            first = self.run(body[0], t)
            self.repeat = outer
            per = first - t
            t = first + per * (n - 1)
            lanes = list(dict.fromkeys([COMPUTE, *(s.lane for s in self.spans[drawn:])]))
            args: dict[str, Arg] = {"trips": n, "iteration_us": per * 1e6}
            label = f"{n - 1} more trips of {inst.name}"
            for lane in lanes:
                self.spans.append(Span(lane, label, "folded", first, t, args, outer))
            how = f"{inst.name}: {n} trips, the first drawn and {n - 1} folded"
        self.loops.append(how)
        loop_args: dict[str, Arg] = {"trips": n if trips is not None else "unknown"}
        label = f"{inst.name} x{n}"
        self.spans.append(Span(COMPUTE, label, "loop", start, t, loop_args, self.repeat))
        return t

    def branch(self, inst: Instruction, t: float) -> float:
        lengths = {}
        for name in inst.callees():
            trial = _Player(self.module, self.source, self.unroll, self.async_starts)
            lengths[name] = trial.run(name, 0.0)
        if not lengths:
            return t
        longest = max(lengths, key=lengths.__getitem__)
        return self.run(longest, t)


def build(
    text: str,
    source: Source | None = None,
    title: str = "",
    unroll: int = UNROLL,
) -> Timeline:
    """The timeline of a compiled program (``compiled.as_text()``): see the module docstring.

    ``source`` times kernels and transfers (default: :class:`KitModel` on an H100 SXM; that
    timeline is cached per program text); loops of at most ``unroll`` trips are drawn trip by
    trip, longer ones folded.
    """
    if source is None:
        played = _play_kit_model(text, unroll)
    else:
        played = _play(text, source, unroll)
    spans, lanes, loops, name = played
    return Timeline(title or parse_module(text).name, name, False, lanes, spans, loops)


type _Played = tuple[tuple[Span, ...], tuple[str, ...], tuple[str, ...], str]


@functools.lru_cache(maxsize=16)
def _play_kit_model(text: str, unroll: int) -> _Played:
    return _play(text, KitModel(text), unroll)


def _play(text: str, source: Source, unroll: int) -> _Played:
    module = parse_module(text)
    if not module.is_scheduled:
        raise ValueError(
            "this HLO is not scheduled (no is_scheduled=true): a timeline needs the compiled "
            "program's order; pass compiled.as_text(), not lowered HLO"
        )
    starts = {p.start: p.done for p in hlo.async_pairs(text) if not p.is_sync}
    player = _Player(module, source, unroll, starts)
    player.run(module.entry, 0.0)
    spans = tuple(sorted(player.spans, key=lambda s: (s.start_s, -s.end_s)))
    used = dict.fromkeys([COMPUTE, *(s.lane for s in spans)])
    first = [n for n in (COMPUTE, COLLECTIVE_STREAM, P2P_STREAM) if n in used]
    lanes = tuple(first + [n for n in used if n not in first])
    return spans, lanes, tuple(player.loops), source.name


def picture(
    *timelines: Timeline, width: int = 960, marks: Mapping[str, str] | None = None
) -> Picture:
    """The timelines one above the other on one time axis (us), with a caption of their
    numbers; ``marks`` points out collectives by name (op name -> label over its window)."""
    if not timelines:
        raise ValueError("picture() needs at least one timeline: pass timeline.build(hlo)")
    panels = [t.panel(marks) for t in timelines]
    svg = render(panels, STYLES, unit="us", axis_label="time from the step's start", width=width)
    caption = "\n".join(t.caption() for t in timelines)
    kinds = sorted({"measured" if t.measured else "modelled" for t in timelines}, reverse=True)
    title = f"The step on one time axis ({' and '.join(kinds)})"
    return Picture(title, caption, svg=svg)


def summary_rows(timelines: Sequence[Timeline]) -> list[dict[str, Arg]]:
    """One table row per timeline: its title and :meth:`Timeline.totals`, rounded to 2 digits."""
    rows: list[dict[str, Arg]] = []
    for t in timelines:
        totals = t.totals()
        row: dict[str, Arg] = {"timeline": t.title}
        for key, value in totals.items():
            assert isinstance(value, (int, float))
            row[key] = round_sig(value) if isinstance(value, float) else value
        rows.append(row)
    return rows
