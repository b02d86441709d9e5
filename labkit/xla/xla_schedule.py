"""Read XLA's latency-hiding schedule dump: what XLA's own cost model said of each instruction.

A compile with the per-compile options ``xla_dump_to=<folder>`` and
``xla_dump_latency_hiding_schedule=True`` (:func:`dump_options`) writes
``<module>.schedule.txt`` into the folder: a ``ScheduleProto`` in protobuf text form
(openxla/xla ``xla/service/latency_hiding_scheduler.cc``, ``DumpLatencyHidingSchedule``). It
holds the module as the scheduler saw it (``hlo_module``: each instruction's name, opcode, id
and operand ids) and one ``computation_schedules`` entry per computation the scheduler ordered:
the entry, and each loop body with async work of its own. Per instruction, in schedule order:
``start_timestamp_cycles`` and ``end_timestamp_cycles`` (the scheduler's own timeline, ending
where the computation ends), and per computation ``scheduler_statistics`` (``total_cycles``,
``*_wasted_cycles``: the time the schedule waits for each kind of async op) and
``cycles_per_microsecond`` (1 for XLA:GPU's estimators: the cycles are microseconds).

Read here (checked against the installed jaxlib, against ``TF_CPP_VMODULE=sol_latency_estimator
=10`` logs of the same compile):

- ``end - start`` of an instruction is its cost (``NodeCost``) in the estimator's units;
- ``total_cycles`` is the sum of the costs in schedule order plus every wait
  (``LatencyHidingStatistics``): the computation's length as XLA's model has it;
- for an async pair, ``end(done) - end(start)`` is the time the scheduler leaves between them.
  Where the pair's own latency (``GetLatencyBetween``) sets it, as it did for every
  collective of some microseconds checked here, it *is* XLA's estimate of the transfer; a
  latency below about 2 us (the done's cost plus 1) leaves the scheduler's placement to set
  it, and the window is then an upper bound (a 0.19 us all-reduce read as 2 us): callers
  label windows that short.

Nothing here compiles; :mod:`labkit.xla.xla_estimate` compiles, reads and compares.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

__all__ = [
    "SCHEDULE_SUFFIX",
    "ComputationSchedule",
    "ScheduleDump",
    "ScheduledOp",
    "dump_options",
    "parse_text_proto",
    "read_folder",
    "read_schedule",
]

SCHEDULE_SUFFIX = ".schedule.txt"
type Message = dict[str, list[str | Message]]
_OPEN = re.compile(r"^(\w+)\s*\{$")
_FIELD = re.compile(r"^(\w+):\s*(.*)$")


def dump_options(folder: str | Path) -> dict[str, str | bool]:
    """Per-compile options that write the latency-hiding schedule into ``folder``."""
    return {"xla_dump_to": str(folder), "xla_dump_latency_hiding_schedule": True}


def parse_text_proto(text: str) -> Message:
    """Protobuf text format, one field per line (as XLA writes it), as nested dicts of lists.

    ``name {`` opens a message, ``}`` closes it, ``name: value`` is a scalar (strings keep
    their quotes); every field is a list, repeated or not. Raises ValueError on anything else.
    """
    root: Message = {}
    stack = [root]
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line == "}":
            if len(stack) == 1:
                raise ValueError(f"line {number}: '}}' closes nothing")
            stack.pop()
        elif opened := _OPEN.match(line):
            child: Message = {}
            stack[-1].setdefault(opened.group(1), []).append(child)
            stack.append(child)
        elif field := _FIELD.match(line):
            stack[-1].setdefault(field.group(1), []).append(field.group(2))
        else:
            raise ValueError(
                f"line {number}: {line[:60]!r} is not 'name {{', '}}' or 'name: value': pass a "
                "ScheduleProto in text form (a *.schedule.txt file of an XLA dump)"
            )
    if len(stack) != 1:
        raise ValueError(f"{len(stack) - 1} message(s) left open at the end of the text")
    return root


def _scalar(msg: Message, key: str, default: str = "") -> str:
    values = msg.get(key, [])
    value = values[0] if values else default
    return value.strip('"') if isinstance(value, str) else default


def _number(msg: Message, key: str) -> float:
    return float(_scalar(msg, key, "0") or 0)


def _messages(msg: Message, key: str) -> list[Message]:
    return [v for v in msg.get(key, []) if isinstance(v, dict)]


@dataclasses.dataclass(frozen=True)
class ScheduledOp:
    """One instruction as XLA's scheduler timed it: microseconds on its computation's timeline.

    ``cost_us`` is ``end_us - start_us``, the estimator's cost of the instruction itself;
    ``window_us`` (an async start only) is ``end(done) - end(start)``, the time the schedule
    leaves its transfer (see the module docstring), None for anything else.
    """

    name: str
    opcode: str
    operands: tuple[str, ...]
    start_us: float
    end_us: float
    window_us: float | None = None

    @property
    def cost_us(self) -> float:
        """The instruction's own cost (its end minus its start)."""
        return self.end_us - self.start_us


@dataclasses.dataclass(frozen=True)
class ComputationSchedule:
    """One computation the scheduler ordered: its ops in order and its statistics (us).

    ``total_us`` is ``scheduler_statistics.total_cycles``: costs plus waits, the computation's
    length by XLA's model; ``wasted_us`` the waits by kind (``{"all-reduce": 41.4}``).
    """

    name: str
    ops: tuple[ScheduledOp, ...]
    total_us: float
    wasted_us: dict[str, float]

    @property
    def cost_us(self) -> float:
        """The summed costs of its instructions (no waits)."""
        return sum(op.cost_us for op in self.ops)

    @property
    def other_waits_us(self) -> float:
        """Waits the statistics count in the total but under no collective kind (an async
        fusion's, for one): ``total - costs - wasted``, never below 0."""
        return max(0.0, self.total_us - self.cost_us - sum(self.wasted_us.values()))

    def op(self, name: str) -> ScheduledOp | None:
        """The scheduled op named ``name``, or None."""
        return next((o for o in self.ops if o.name == name), None)


@dataclasses.dataclass(frozen=True)
class ScheduleDump:
    """A whole ``*.schedule.txt``: the module's name and each scheduled computation."""

    module: str
    computations: dict[str, ComputationSchedule]
    cycles_per_us: float


def _wasted(stats: Message) -> dict[str, float]:
    out = {}
    for key, values in stats.items():
        if key.endswith("_wasted_cycles") and key != "total_wasted_cycles" and values:
            kind = key.removesuffix("_wasted_cycles").replace("_", "-")
            out[kind] = float(str(values[0]))
    return out


def read_schedule(text: str) -> ScheduleDump:
    """A :class:`ScheduleDump` from the text of a ``*.schedule.txt`` file."""
    root = parse_text_proto(text)
    modules = _messages(root, "hlo_module")
    if not modules:
        raise ValueError("no hlo_module in this text: pass a *.schedule.txt of an XLA dump")
    module = modules[0]
    names: dict[str, tuple[str, str, tuple[str, ...]]] = {}
    comp_names: dict[str, str] = {}
    for comp in _messages(module, "computations"):
        comp_names[_scalar(comp, "id")] = _scalar(comp, "name")
        for inst in _messages(comp, "instructions"):
            operands = tuple(str(v) for v in inst.get("operand_ids", []))
            names[_scalar(inst, "id")] = (_scalar(inst, "name"), _scalar(inst, "opcode"), operands)
    rates = [_number(s, "cycles_per_microsecond") for s in _messages(root, "computation_schedules")]
    per_us = next((r for r in rates if r > 0), 1.0)
    computations = {}
    for sched in _messages(root, "computation_schedules"):
        cid = _scalar(sched, "computation_id")
        rate = _number(sched, "cycles_per_microsecond") or per_us
        ops = []
        for inst in _messages(sched, "instructions"):
            name, opcode, operand_ids = names.get(_scalar(inst, "id"), ("", "", ()))
            operands = tuple(names[o][0] for o in operand_ids if o in names)
            start = _number(inst, "start_timestamp_cycles") / rate
            ops.append(
                ScheduledOp(
                    name, opcode, operands, start, _number(inst, "end_timestamp_cycles") / rate
                )
            )
        ops = _with_windows(ops)
        stats = next(iter(_messages(sched, "scheduler_statistics")), {})
        total = _number(stats, "total_cycles") / rate
        wasted = {k: v / rate for k, v in _wasted(stats).items()}
        name = comp_names.get(cid, f"computation {cid}")
        computations[name] = ComputationSchedule(name, tuple(ops), total, wasted)
    return ScheduleDump(_scalar(module, "name"), computations, per_us)


def _with_windows(ops: list[ScheduledOp]) -> list[ScheduledOp]:
    """Each async start with ``end(done) - end(start)`` (its done: the op naming it first)."""
    by_name = {op.name: op for op in ops}
    done_of: dict[str, ScheduledOp] = {}
    for op in ops:
        if op.opcode.endswith("-done") and op.operands and op.operands[0] in by_name:
            done_of.setdefault(op.operands[0], op)
    out = []
    for op in ops:
        done = done_of.get(op.name) if op.opcode.endswith("-start") else None
        window = None if done is None else done.end_us - op.end_us
        out.append(dataclasses.replace(op, window_us=window))
    return out


def read_folder(folder: str | Path, module: str | None = None) -> ScheduleDump | None:
    """The schedule of ``module`` (default: the one ``*.schedule.txt`` there) in an XLA dump
    folder; None when XLA wrote none (its scheduler had no async work to order)."""
    found = sorted(Path(folder).glob(f"*{SCHEDULE_SUFFIX}"))
    if module is not None:
        found = [p for p in found if p.name == f"{module}{SCHEDULE_SUFFIX}"]
    if not found:
        return None
    if len(found) > 1:
        raise ValueError(
            f"{len(found)} schedules in {folder} ({', '.join(p.name for p in found)}): name the "
            "module (read_folder(folder, module='jit_step'))"
        )
    return read_schedule(found[0].read_text())
