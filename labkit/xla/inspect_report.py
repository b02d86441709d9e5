"""What a compiled program does on its target, as one report: the data, its JSON, its diff.

:func:`build_report` reads a compiled GPU program (``compiled.as_text()``) with the kit's HLO
readers and cost models, nothing new: collectives with their overlap estimate
(:mod:`labkit.xla.overlap`), GEMMs (:mod:`labkit.xla.gemms`, FLOPs from
:mod:`labkit.xla.cost`), kernels by kind (:mod:`labkit.xla.hlo`), loops, memory as the
compiler assigned it (:mod:`labkit.xla.memory`) against the GPU's HBM, the kit's model of the
step (:mod:`labkit.xla.predict`: a range with every term, and how it moves with its two guessed
constants), XLA's own estimate beside it when the compile dumped its schedule
(:mod:`labkit.xla.xla_estimate`), and findings with what to try (:mod:`labkit.xla.findings`).
:func:`labkit.xla.inspect.inspect` compiles a function and calls it.

A :class:`Report` renders as markdown in a notebook (``_repr_markdown_``), as plain text
(``str(report)``) and as JSON (:meth:`Report.to_json`, read back by :meth:`Report.from_json`).
The JSON layout is the dataclasses below (a GEMM: :class:`labkit.xla.gemms.Gemm`), written
out as a JSON Schema in :data:`labkit.xla.inspect_schema.SCHEMA` (``labkit inspect --schema``
prints it); :data:`SCHEMA_VERSION` changes whenever a field changes meaning or goes away.
:meth:`Report.diff` says what a flag set or a sharding change did.

Every time here is a model's, read from the program (the kit's: datasheet peaks plus two
guessed constants; XLA's: its scheduler's cost model), never a measurement; every byte count
is per device.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Mapping
from typing import Any, Literal, TypedDict, TypeGuard

from labkit.core.hardware import hardware
from labkit.core.report import markdown_table
from labkit.core.types import JSON, CompilerOption
from labkit.xla import findings as finder
from labkit.xla import gemms as gemm_reader
from labkit.xla import hlo as hlo_reader
from labkit.xla import overlap, predict, xla_estimate
from labkit.xla.cost import hlo_flops
from labkit.xla.findings import PackUnpack, SplitK
from labkit.xla.gemms import Gemm
from labkit.xla.hlo_text import parse_module
from labkit.xla.memory import Memory
from labkit.xla.predict import SensitivityRow
from labkit.xla.tiles import Tiles, default_tiles
from labkit.xla.tiles import label as tiles_label
from labkit.xla.xla_estimate import TermPair, XlaEstimate

__all__ = [
    "SCHEMA_VERSION",
    "CollectiveInfo",
    "DiffRow",
    "Findings",
    "FlopsInfo",
    "LoopInfo",
    "MemoryInfo",
    "ProgramInfo",
    "Report",
    "ReportDiff",
    "StepInfo",
    "Term",
    "XlaEstimateInfo",
    "build_report",
]

SCHEMA_VERSION = 3
# 2: a GEMM's shapes are lhs_shape, rhs_shape, out_shape (were lhs, rhs, out)
# 3: the step's range terms are "model's range, low end"/"high end" (were lower/upper bound);
#    step.sensitivity; xla_estimate (XLA's own model); findings (split-K, pack/unpack, try)
type Value = str | float | None
"""A value a report's summary or diff shows: a count, bytes, microseconds, a flag list."""


@dataclasses.dataclass(frozen=True)
class ProgramInfo:
    """What was compiled, for which target, how (``compiler_options``: the flags given)."""

    name: str
    target: str  # a labkit.core.hardware table name, e.g. "H100 SXM"
    num_devices: int
    mesh: dict[str, int]  # axis name -> size ({} when unknown)
    compiler_options: dict[str, CompilerOption]
    jax_version: str  # "" when unknown (a report read from saved HLO text)
    note: str


@dataclasses.dataclass(frozen=True)
class FlopsInfo:
    """FLOPs of one step: ``total`` over all devices, ``per_device``, and where they come from."""

    total: float
    per_device: float
    source: str  # "xla cost analysis" or "hlo matmuls"


@dataclasses.dataclass(frozen=True)
class LoopInfo:
    """A ``while`` loop (``scan``, ``fori_loop``) and its trip count (None: XLA knows none)."""

    name: str
    body: str
    trip_count: int | None


@dataclasses.dataclass(frozen=True)
class CollectiveInfo:
    """One collective (or send/recv) with its overlap estimate; bytes per device.

    ``per_step`` is how often it runs per step (a loop body's: trip count). ``kernel`` is
    "nccl" or "triton" (XLA's own collective kernels). ``hidden`` is the fraction of the
    transfer that the kernels scheduled between start and done can cover (0 when
    synchronous); ``verdict`` is "hidden", "partly hidden" or "exposed".
    """

    name: str
    kind: str
    mode: str  # "async" (start/done pair) or "sync"
    computation: str
    per_step: int
    bytes: int
    dtypes: list[str]
    group_size: int | None
    groups: int | None  # how many groups of devices take part separately
    replica_groups: list[list[int]] | None
    kernel: str
    link_bytes: float
    latency_us: float
    wire_us: float
    transfer_us: float
    kernels_between: int
    compute_us: float
    hidden: float
    verdict: str


@dataclasses.dataclass(frozen=True)
class MemoryInfo:
    """Bytes per device from XLA's buffer assignment, and the share of the GPU's HBM."""

    argument: int
    output: int
    alias: int
    temp: int
    code: int
    peak: int | None
    total: int  # argument + output - alias + temp
    hbm: int
    fraction: float  # total / hbm


class Term(TypedDict):
    """One term of the step-time model: its value in microseconds (or a count) and how."""

    term: str
    value: float
    unit: Literal["us", "count"]
    how: str


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """The kit's model of the step: its range (microseconds; model numbers, not bounds), every
    term behind it, and the range with its two guessed constants scaled (``sensitivity``)."""

    lower_us: float
    upper_us: float
    kernels: int
    collectives: int
    terms: list[Term]
    formula: str
    sensitivity: list[SensitivityRow] = dataclasses.field(default_factory=list)

    def terms_by_name(self) -> dict[str, float]:
        """Term name -> value (microseconds, or a count for "kernels" and "collectives")."""
        return {t["term"]: t["value"] for t in self.terms}


class FlaggedOp(TypedDict):
    """An op whose time in XLA's model is a fixed fallback value, not an estimate."""

    name: str
    us: float
    why: str


@dataclasses.dataclass(frozen=True)
class XlaEstimateInfo:
    """XLA's own estimate of the step (its latency-hiding scheduler's cost model, read from
    the compile's schedule dump: :mod:`labkit.xla.xla_estimate`), beside the kit's model.

    ``terms`` pair the two models term by term; ``disagreements`` name the ops where they
    differ most; ``flagged`` the ops whose XLA time is a fallback constant; ``unscheduled``
    the computations XLA's scheduler left without times (counted as 0 in its step).
    """

    estimator: str
    step_us: float
    terms: list[TermPair]
    disagreements: list[dict[str, str | float]]
    flagged: list[FlaggedOp]
    unscheduled: list[str]


@dataclasses.dataclass(frozen=True)
class Findings:
    """What the program shows on a read (:mod:`labkit.xla.findings`): split-K GEMMs, the
    pack and unpack kernels around combined all-reduces, and what to try."""

    split_k: list[SplitK]
    pack_unpack: list[PackUnpack]
    what_to_try: list[str]


def _mb(n: float) -> str:
    return f"{n / 1e6:.3g} MB" if n >= 1e6 else f"{n / 1e3:.3g} KB" if n >= 1e3 else f"{n:g} B"


def _flop(n: float) -> str:
    for scale, unit in ((1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP")):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.3g} FLOP"


def _signature(c: CollectiveInfo) -> str:
    group = f" x{c.group_size}" if c.group_size else ""
    return f"{c.kind} {_mb(c.bytes)} {'/'.join(c.dtypes) or '-'}{group} ({c.mode})"


@dataclasses.dataclass(frozen=True)
class Report:
    """A compiled program, read: see the module docstring. ``hlo`` is kept, not serialized."""

    program: ProgramInfo
    flops: FlopsInfo
    fusions: dict[str, int]
    custom_calls: dict[str, int]
    loops: list[LoopInfo]
    collectives: list[CollectiveInfo]
    gemms: list[Gemm]
    memory: MemoryInfo | None
    step: StepInfo
    xla_estimate: XlaEstimateInfo | None = None
    findings: Findings = dataclasses.field(default_factory=lambda: Findings([], [], []))
    schema_version: int = SCHEMA_VERSION
    hlo: str = dataclasses.field(default="", repr=False, compare=False)
    xla: XlaEstimate | None = dataclasses.field(default=None, repr=False, compare=False)

    # -- numbers people ask for ------------------------------------------------------

    def collective_counts(self) -> dict[str, int]:
        """Collectives by kind, each op once (as in the program text)."""
        return dict(Counter(c.kind for c in self.collectives))

    def collective_bytes(self) -> dict[str, int]:
        """Bytes per device by collective kind, per step (loop bodies: times their trips)."""
        out: Counter[str] = Counter()
        for c in self.collectives:
            out[c.kind] += c.bytes * c.per_step
        return dict(out)

    def verdicts(self) -> dict[str, int]:
        """How many transfers are hidden, partly hidden and exposed."""
        counts = Counter(c.verdict for c in self.collectives)
        return {k: counts[k] for k in ("hidden", "partly hidden", "exposed")}

    def gemm_kernels(self) -> dict[str, int]:
        """GEMMs by kernel ("cublas", "triton", "dot"), each op once."""
        return dict(Counter(g.kernel for g in self.gemms))

    def summary(self) -> dict[str, float | None]:
        """The headline numbers as one flat dict (what the markdown summary table shows)."""
        colls = self.collective_counts()
        out: dict[str, float | None] = {
            "kernels per step": self.step.kernels,
            "collectives": sum(colls.values()),
            **{f"{k} count": v for k, v in sorted(colls.items())},
            **{f"{k} bytes": v for k, v in sorted(self.collective_bytes().items())},
            "async collectives": sum(c.mode == "async" for c in self.collectives),
            "sync collectives": sum(c.mode == "sync" for c in self.collectives),
            **{f"{k} transfers": v for k, v in self.verdicts().items()},
            "exposed communication us": self.step.terms_by_name().get("exposed communication"),
            "gemms": len(self.gemms),
            "flops per step": self.flops.total,
            "model's range low us": self.step.lower_us,
            "model's range high us": self.step.upper_us,
        }
        if self.xla_estimate is not None:
            out["XLA's model step us"] = self.xla_estimate.step_us
        if self.memory is not None:
            for key in ("argument", "output", "alias", "temp", "total"):
                out[f"memory {key} bytes"] = getattr(self.memory, key)
        return out

    # -- JSON -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, JSON]:
        """Plain data in the :data:`SCHEMA` layout (no HLO text)."""
        data = dataclasses.asdict(dataclasses.replace(self, xla=None))
        data.pop("hlo")
        data.pop("xla")
        return {"schema_version": data.pop("schema_version"), **data}

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON text (:data:`SCHEMA`, version :data:`SCHEMA_VERSION`)."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:  # JSON, read into the dataclasses
        """A report from :meth:`to_dict` data; refuses another schema version."""
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"this report has schema_version {version!r}; this labkit reads version "
                f"{SCHEMA_VERSION}: inspect the program again with this labkit"
            )
        memory = data.get("memory")
        found, xla = data["findings"], data.get("xla_estimate")
        findings = Findings(
            [SplitK(**x) for x in found["split_k"]],
            [
                PackUnpack(**{**x, "pack": tuple(x["pack"]), "unpack": tuple(x["unpack"])})
                for x in found["pack_unpack"]
            ],
            list(found["what_to_try"]),
        )
        return cls(
            ProgramInfo(**data["program"]),
            FlopsInfo(**data["flops"]),
            dict(data["fusions"]),
            dict(data["custom_calls"]),
            [LoopInfo(**x) for x in data["loops"]],
            [CollectiveInfo(**x) for x in data["collectives"]],
            [Gemm(**{**x, "reads": tuple(x["reads"])}) for x in data["gemms"]],
            MemoryInfo(**memory) if memory is not None else None,
            StepInfo(**data["step"]),
            XlaEstimateInfo(**xla) if xla is not None else None,
            findings,
        )

    @classmethod
    def from_json(cls, text: str) -> Report:
        """A report from :meth:`to_json` text."""
        return cls.from_dict(json.loads(text))

    # -- rendering ----------------------------------------------------------------------

    def to_markdown(self) -> str:
        """The report as markdown (headings and tables)."""
        return _render(self, markdown=True)

    def to_text(self) -> str:
        """The report as plain text for a terminal."""
        return _render(self, markdown=False)

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def __str__(self) -> str:
        return self.to_text()

    def diff(self, other: Report, labels: tuple[str, str] | None = None) -> ReportDiff:
        """What changed from this report to ``other`` (a flag set, a sharding, a model);
        ``labels`` name the two (default: the programs' names)."""
        return _diff(self, other, labels)


# ---------------------------------------------------------------------------------------
# Building


def _collective_rows(text: str, gpu: str, times: dict[str, int]) -> list[CollectiveInfo]:
    found = {c.name: c for c in hlo_reader.collectives(text)}
    out = []
    for e in overlap.estimate(text, gpu):
        c = found.get(e.name)
        groups = c.replica_groups if c is not None else None
        out.append(
            CollectiveInfo(
                name=e.name,
                kind=e.kind,
                mode=e.mode,
                computation=e.computation,
                per_step=times.get(e.computation, 1),
                bytes=e.bytes,
                dtypes=list(c.dtypes) if c is not None else [],
                group_size=c.group_size if c is not None else 2,
                groups=len(groups) if groups else None,
                replica_groups=groups,
                kernel="triton" if c is not None and c.kernel == "triton" else "nccl",
                link_bytes=e.link_bytes,
                latency_us=e.latency_s * 1e6,
                wire_us=e.wire_s * 1e6,
                transfer_us=e.transfer_s * 1e6,
                kernels_between=e.kernels,
                compute_us=e.compute_s * 1e6,
                hidden=e.hidden,
                verdict=e.verdict,
            )
        )
    return out


def _step(text: str, gpu: str, p: predict.StepPrediction) -> StepInfo:
    sensitivity = predict.sensitivity(text, gpu)
    counts = ("kernels", "collectives")
    terms: list[Term] = [
        {
            "term": r["term"],
            "value": r["us"],
            "unit": "count" if r["term"] in counts else "us",
            "how": r["how"],
        }
        for r in p.rows()
    ]
    formula = f"{predict.formula()}\n{overlap.formula(gpu)}"
    return StepInfo(
        predict.round_sig(p.lower_s * 1e6),
        predict.round_sig(p.upper_s * 1e6),
        p.kernels,
        p.collectives,
        terms,
        formula,
        sensitivity,
    )


def _xla_info(
    text: str, est: XlaEstimate, gpu: str, pred: predict.StepPrediction
) -> XlaEstimateInfo:
    return XlaEstimateInfo(
        est.estimator,
        predict.round_sig(est.step_us),
        xla_estimate.compare(text, est, gpu, pred),
        xla_estimate.disagreements(text, est, gpu),
        [{"name": o.name, "us": o.us, "why": o.flag} for o in est.flagged()],
        list(est.unscheduled),
    )


def build_report(
    hlo: str,
    *,
    name: str = "program",
    gpu: str = "H100 SXM",
    mesh: Mapping[str, int] | None = None,
    compiler_options: Mapping[str, CompilerOption] | None = None,
    memory: Memory | None = None,
    xla_flops: float | None = None,
    jax_version: str = "",
    xla: XlaEstimate | None = None,
    tiles: Tiles | None = None,
) -> Report:
    """The :class:`Report` of a compiled GPU program's HLO text on ``gpu``.

    ``memory`` (:func:`labkit.xla.memory.memory`) and ``xla_flops`` (XLA's cost analysis, per
    device) come from the compiled object when there is one; without them the report has no
    memory section and counts matmul FLOPs from the HLO. ``xla`` is XLA's own estimate of
    the same compile (:func:`labkit.xla.xla_estimate.compile_with_estimate`); without it the
    report has no XLA section. ``tiles`` says where its GEMM tiles came from
    (:mod:`labkit.xla.tiles`; None: the kit's default).
    """
    hw = hardware(gpu)
    module = parse_module(hlo)
    times = predict.trip_multipliers(module)
    devices = module.num_devices or (math.prod(mesh.values()) if mesh else 1)
    if xla_flops and xla_flops > 0:
        flops = FlopsInfo(xla_flops * devices, xla_flops, "xla cost analysis")
    else:  # deviceless compiles have no cost analysis
        per_device = hlo_flops(hlo, per_device=True)
        flops = FlopsInfo(per_device * devices, per_device, "hlo matmuls")
    loops = [
        LoopInfo(name=i.name, body=",".join(i.callees("body")), trip_count=i.trip_count)
        for insts in module.computations.values()
        for i in insts
        if i.opcode == "while"
    ]
    mem = None
    if memory is not None:
        hbm = int(hw.memory_gb * 1e9)
        mem = MemoryInfo(
            argument=memory.argument,
            output=memory.output,
            alias=memory.alias,
            temp=memory.temp,
            code=memory.code,
            peak=memory.peak,
            total=memory.total,
            hbm=hbm,
            fraction=memory.total / hbm,
        )
    predicted = predict.predict(hlo, hw)
    step = _step(hlo, hw.name, predicted)
    note = (
        f"compiled for {devices} x {hw.name} without a GPU: XLA's program for this target, "
        f"not run; GEMM {tiles_label(default_tiles() if tiles is None else tiles)}; times are "
        "estimates from the program"
    )
    return Report(
        ProgramInfo(
            name,
            hw.name,
            devices,
            dict(mesh or {}),
            dict(compiler_options or {}),
            jax_version,
            note,
        ),
        flops,
        dict(sorted(hlo_reader.fusions(hlo).items())),
        dict(sorted(hlo_reader.custom_calls(hlo).items())),
        loops,
        _collective_rows(hlo, hw.name, times),
        gemm_reader.gemms(hlo),
        mem,
        step,
        None if xla is None else _xla_info(hlo, xla, hw.name, predicted),
        Findings(
            finder.split_k(hlo),
            finder.pack_and_unpack(hlo, hw, memory_s=predicted.memory_s),
            finder.what_to_try(predicted),
        ),
        hlo=hlo,
        xla=xla,
    )


# ---------------------------------------------------------------------------------------
# Rendering


def _heading(title: str, markdown: bool, level: int = 4) -> str:
    return f"{'#' * level} {title}" if markdown else f"{title}\n{'-' * len(title)}"


def _code(text: str, markdown: bool) -> str:
    return f"`{text}`" if markdown else text


def _summary_rows(r: Report) -> list[dict[str, str]]:
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(r.collective_counts().items())) or "none"
    v = r.verdicts()
    gemm_kinds = ", ".join(f"{n} {k}" for k, n in sorted(r.gemm_kernels().items())) or "none"
    dtypes = sorted({f"{g.lhs} x {g.rhs}" for g in r.gemms})
    rows = [
        {"what": "kernels per step", "value": f"{r.step.kernels} (loops count their trips)"},
        {
            "what": "collectives",
            "value": f"{kinds}; {v['hidden']} hidden, {v['partly hidden']} partly hidden, "
            f"{v['exposed']} exposed",
        },
        {
            "what": "bytes per device per step",
            "value": ", ".join(f"{k} {_mb(b)}" for k, b in sorted(r.collective_bytes().items()))
            or "none",
        },
        {"what": "GEMMs", "value": f"{gemm_kinds}; operands {', '.join(dtypes) or '-'}"},
        {
            "what": "FLOPs per step",
            "value": f"{_flop(r.flops.total)} on all devices ({r.flops.source})",
        },
    ]
    if r.memory is not None:
        m = r.memory
        rows.append(
            {
                "what": "memory per device",
                "value": f"{_mb(m.total)} of {m.hbm / 1e9:.0f} GB HBM ({m.fraction:.2%}): "
                f"argument {_mb(m.argument)}, output {_mb(m.output)}, alias {_mb(m.alias)}, "
                f"temp {_mb(m.temp)}",
            }
        )
    if r.loops:
        trips = ", ".join(f"{lp.name} x{lp.trip_count or '?'}" for lp in r.loops)
        rows.append({"what": "loops", "value": trips})
    rows.append(
        {
            "what": "step, the kit's model",
            "value": f"{r.step.lower_us:g}-{r.step.upper_us:g} us (the model's range: two guessed "
            "constants, not bounds; not a measurement)",
        }
    )
    if r.xla_estimate is not None:
        rows.append(
            {
                "what": "step, XLA's model",
                "value": f"{r.xla_estimate.step_us:g} us (its scheduler's estimate, "
                f"{r.xla_estimate.estimator}; not a measurement)",
            }
        )
    return rows


def _collective_table(r: Report) -> list[dict[str, str | int]]:
    return [
        {
            "collective": c.name,
            "kind": c.kind + (" (triton)" if c.kernel == "triton" else ""),
            "mode": c.mode,
            "bytes": c.bytes,
            "group": f"{c.groups or 1} x {c.group_size}" if c.group_size else "-",
            "per step": c.per_step,
            "transfer us": f"{c.transfer_us:.3g} = {c.latency_us:g} + {c.wire_us:.3g}",
            "kernels between": c.kernels_between,
            "their us": f"{c.compute_us:.3g}",
            "hidden": f"{c.hidden:.0%}",
            "verdict": c.verdict,
        }
        for c in r.collectives
    ]


def _gemm_table(r: Report) -> list[dict[str, str | int]]:
    splits = {k.dot: f"x{k.splits} (K={k.k})" for k in r.findings.split_k}
    groups: dict[tuple[str, ...], list[Gemm]] = {}
    for g in r.gemms:
        key = (
            g.kernel,
            g.lhs_shape,
            g.rhs_shape,
            g.out_shape,
            ", ".join(g.reads),
            g.precision,
            g.algorithm,
            splits.get(g.name, ""),
        )
        groups.setdefault(key, []).append(g)
    return [
        {
            "kernel": kernel,
            "lhs": lhs,
            "rhs": rhs,
            "out": out,
            "reads": reads,
            "precision": precision + (f" {algorithm}" if algorithm else ""),
            "split-K": split or "-",
            "ops": len(found),
            "calls per step": sum(g.per_step for g in found),
            "FLOPs per call": _flop(found[0].flops),
        }
        for (kernel, lhs, rhs, out, reads, precision, algorithm, split), found in groups.items()
    ]


def _render(r: Report, markdown: bool) -> str:
    p = r.program
    mesh = " x ".join(f"{k}={v}" for k, v in p.mesh.items()) or "?"
    flags = ", ".join(f"{k}={v}" for k, v in p.compiler_options.items()) or "none (XLA's defaults)"
    title = f"{_code(p.name, markdown)} on {p.num_devices} x {p.target}, mesh {mesh}"
    parts = [
        f"### {title}" if markdown else f"{title}\n{'=' * len(title)}",
        f"{p.note}. Flags: {flags}.",
        markdown_table(_summary_rows(r), ["what", "value"]),
        _heading(f"Collectives ({len(r.collectives)})", markdown),
    ]
    if r.collectives:
        cols = list(_collective_table(r)[0])
        parts.append(markdown_table(_collective_table(r), cols))
    else:
        parts.append("None: each device works alone.")
    parts.append(_heading(f"GEMMs ({len(r.gemms)})", markdown))
    if r.gemms:
        parts.append(markdown_table(_gemm_table(r), list(_gemm_table(r)[0])))
    else:
        parts.append("None.")
    kernels = [{"kernel": k, "count": n} for k, n in {**r.fusions, **r.custom_calls}.items()]
    parts += [
        _heading("Kernels by kind (each op once; fusions and library calls)", markdown),
        markdown_table(kernels, ["kernel", "count"]),
    ]
    if r.memory is not None:
        m = r.memory
        row = {k: _mb(getattr(m, k)) for k in ("argument", "output", "alias", "temp", "total")}
        row["peak"] = _mb(m.peak) if m.peak is not None else "-"
        row["of HBM"] = f"{m.fraction:.2%} of {m.hbm / 1e9:.0f} GB"
        parts += [
            _heading("Memory per device (XLA's buffer assignment)", markdown),
            markdown_table([row], list(row)),
        ]
    fence = "```" if markdown else ""
    title = f"Step, the kit's model: {r.step.lower_us:g}-{r.step.upper_us:g} us (its range)"
    parts += [
        _heading(title, markdown),
        f"{fence}\n{r.step.formula}\n{fence}".strip(),
        markdown_table(r.step.terms, ["term", "value", "unit", "how"]),
    ]
    if r.step.sensitivity:
        parts += [
            "Both ends rest on two guessed constants; the range with them scaled:",
            markdown_table(
                r.step.sensitivity, ["kernel_floor_us", "collective_us", "low_us", "high_us"]
            ),
        ]
    parts += _xla_parts(r, markdown) + _finding_parts(r, markdown)
    return "\n\n".join(parts) + "\n"


def _xla_parts(r: Report, markdown: bool) -> list[str]:
    x = r.xla_estimate
    if x is None:
        return []
    title = f"Step, XLA's model: {x.step_us:g} us ({x.estimator})"
    parts = [
        _heading(title, markdown),
        "XLA's latency-hiding scheduler costs every instruction with its own model (read from "
        "the compile's schedule dump; not a measurement, and not the kit's model): term by "
        "term beside the kit's, then the ops where the two differ most.",
        markdown_table(x.terms, ["term", "kit", "xla", "why"]),
        markdown_table(x.disagreements, ["op", "xla model", "kit us", "xla us", "why"]),
    ]
    fixed = Counter(f["why"] for f in x.flagged)
    if fixed:
        lines = "\n".join(f"- {n} op(s): {why}" for why, n in sorted(fixed.items()))
        parts.append(f"XLA values that are fallback constants, not estimates:\n{lines}")
    if x.unscheduled:
        names = ", ".join(_code(n, markdown) for n in x.unscheduled)
        parts.append(f"Computations XLA's scheduler did not time (0 in its step): {names}")
    return parts


def _finding_parts(r: Report, markdown: bool) -> list[str]:
    f = r.findings
    lines = [
        f"split-K: {_code(k.kernel, markdown)} sums {k.splits} partial products of K={k.k} "
        f"({_mb(k.partial_bytes)} of partials written per call, read back by the next kernel)"
        for k in f.split_k
    ]
    lines += [
        f"{_code(p.collective, markdown)} combines {len(p.unpack)} buffers: packing "
        f"({', '.join(p.pack)}) and {len(p.unpack)} unpacking kernels cost "
        f"{p.memory_us:.2g} us of HBM traffic, {p.share_of_memory:.0%} of the memory term, "
        f"and {p.floor_us:.2g} us of kernel floors"
        for p in f.pack_unpack
    ]
    lines += [f"what to try: {t}" for t in f.what_to_try]
    if not lines:
        return []
    return [_heading("Findings", markdown), "\n".join(f"- {line}" for line in lines)]


# ---------------------------------------------------------------------------------------
# Diff


class DiffRow(TypedDict):
    """One row of a :class:`ReportDiff`: a summary number (or the flags, the mesh) before and
    after, and the change as people read it ("" when unchanged)."""

    what: str
    before: Value
    after: Value
    change: str


def does_not_fit(report: Report) -> str | None:
    """ "does not fit on an H100 SXM (80 GB): needs N GB per GPU" when XLA's buffer assignment
    asks for more than the GPU's HBM, else None (it fits, or no memory was reported)."""
    m = report.memory
    if m is None or m.total <= m.hbm:
        return None
    return (
        f"does not fit on an {report.program.target} ({m.hbm / 1e9:.0f} GB): needs "
        f"{m.total / 1e9:,.0f} GB per GPU ({m.fraction:.0%} of its HBM, XLA's buffer assignment)"
    )


@dataclasses.dataclass(frozen=True)
class ReportDiff:
    """What changed between two reports: rows ``what, before, after, change`` and the
    collectives added and removed (matched by kind, bytes, types, group and mode)."""

    before: str
    after: str
    rows: list[DiffRow]
    added: list[str]
    removed: list[str]

    def changed(self) -> list[DiffRow]:
        """Only the rows whose value changed."""
        return [row for row in self.rows if row["before"] != row["after"]]

    def value(self, what: str) -> tuple[Value, Value]:
        """``(before, after)`` of one row, e.g. ``value("all-reduce count")``."""
        for row in self.rows:
            if row["what"] == what:
                return row["before"], row["after"]
        raise KeyError(f"no row {what!r}; rows: {[r['what'] for r in self.rows]}")

    def to_dict(self) -> dict[str, JSON]:
        """Plain data (rows, added, removed)."""
        return dataclasses.asdict(self)

    def to_markdown(self) -> str:
        """The changed rows and the collectives added and removed, as markdown."""
        return self._render(markdown=True)

    def to_text(self) -> str:
        """The same as plain text."""
        return self._render(markdown=False)

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def __str__(self) -> str:
        return self.to_text()

    def _render(self, markdown: bool) -> str:
        title = f"{self.before} -> {self.after}"
        changed = self.changed()
        parts = [f"### {title}" if markdown else f"{title}\n{'=' * len(title)}"]
        if changed:
            shown = [
                {**r, "before": _shown(r, "before"), "after": _shown(r, "after")} for r in changed
            ]
            parts.append(markdown_table(shown, ["what", "before", "after", "change"]))
        else:
            parts.append("Nothing in the report changed.")
        parts.append(f"{len(self.rows) - len(changed)} other rows unchanged.")
        for label, items in (("added", self.added), ("removed", self.removed)):
            if items:
                lines = "\n".join(f"- {_code(x, markdown)}" for x in items)
                parts.append(f"Collectives {label} ({len(items)}):\n{lines}")
        return "\n\n".join(parts) + "\n"


def _number(what: str, value: float) -> str:
    """A diff number as people read it: bytes in KB/MB, FLOPs in GFLOP, others as they are."""
    if what.endswith("bytes"):
        return ("-" if value < 0 else "") + _mb(abs(value))
    if what.startswith("flops"):
        return ("-" if value < 0 else "") + _flop(abs(value))
    return f"{value:g}"


def _shown(row: DiffRow, side: Literal["before", "after"]) -> str:
    value = row[side]
    if not _is_number(value):
        return str(value)
    return _number(row["what"], value)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _change(what: str, a: Value, b: Value) -> str:
    if not (_is_number(a) and _is_number(b)):
        return "" if a == b else "changed"
    if a == b:
        return ""
    delta = _number(what, b - a)
    delta = delta if delta.startswith("-") else "+" + delta
    return f"{delta} ({(b - a) / abs(a):+.0%})" if a else delta


def _diff(a: Report, b: Report, labels: tuple[str, str] | None) -> ReportDiff:
    def flags(r: Report) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted(r.program.compiler_options.items()))

    def mesh(r: Report) -> str:
        return ",".join(f"{k}={v}" for k, v in r.program.mesh.items())

    sa, sb = a.summary(), b.summary()
    pairs: list[tuple[str, Value, Value]] = [
        ("flags", flags(a) or "none", flags(b) or "none"),
        ("mesh", mesh(a), mesh(b)),
        *((key, sa.get(key, 0), sb.get(key, 0)) for key in dict.fromkeys([*sa, *sb])),
    ]
    rows: list[DiffRow] = [
        {"what": what, "before": x, "after": y, "change": _change(what, x, y)}
        for what, x, y in pairs
    ]
    before = Counter(_signature(c) for c in a.collectives)
    after = Counter(_signature(c) for c in b.collectives)
    if labels is None:
        same = a.program.name == b.program.name
        labels = (f"{a.program.name} before", "after") if same else (a.program.name, b.program.name)
    return ReportDiff(
        labels[0],
        labels[1],
        rows,
        sorted((after - before).elements()),
        sorted((before - after).elements()),
    )
