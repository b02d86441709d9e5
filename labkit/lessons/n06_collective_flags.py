"""06_collective_flags: threshold sweeps, a scanned FSDP MLP, a shift loop, the flag explorer.

The notebook's own code. Compiles go through :func:`labkit.gpt.compile.compile_train_step`
(cached per whole configuration): the H100 program, or its cuBLAS variant where a count of
collectives and bytes needs many compiles (:data:`COUNTS_VARIANT`). Two small programs of its
own show what the GPT would show at many times the compile cost: a scanned FSDP MLP
(:func:`compile_scanned_mlp`, also under ``XLA_FLAGS`` in a subprocess) and a shift loop
(:func:`compile_shift_loop`). Program comparison is
:mod:`labkit.xla.compare`, overlap and step estimates :mod:`labkit.xla.overlap` and
:mod:`labkit.xla.predict`.
:func:`flag_explorer` is a thin widget over :func:`flag_diff`, a plain tested function.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict, Unpack

from labkit.core.feedback import Feedback, check_choice, check_integer, judge, unanswered
from labkit.core.figures import Picture, Series, sweep
from labkit.core.hardware import hardware
from labkit.core.mesh import abstract
from labkit.core.timing import sequence_param
from labkit.core.types import CompilerOption, CompilerOptions
from labkit.gpt.compile import compile_train_step, same_program_options
from labkit.gpt.config import GPTConfig
from labkit.parallel.sharding import Strategy, scanned_tanh_loss
from labkit.xla import hlo, overlap, predict
from labkit.xla.aot import AotResult, JitKwargs, compile_for_gpu, h100_mesh
from labkit.xla.compare import diff, diff_rows, identical, is_pipelined
from labkit.xla.flags import (
    FlagCompile,
    compile_options,
    installed_defaults,
    report_compile,
    run_compile_child,
)
from labkit.xla.pass_trace import traced

if TYPE_CHECKING:
    import ipywidgets
    import jax
    from jax.sharding import Mesh

THRESHOLD_FLAGS: dict[str, tuple[str, ...]] = {
    "dp": ("xla_gpu_all_reduce_combine_threshold_bytes",),
    "fsdp": (
        "xla_gpu_all_gather_combine_threshold_bytes",
        "xla_gpu_reduce_scatter_combine_threshold_bytes",
    ),
}
# The variant compiled where only collectives and their bytes are counted and the H100
# program would cost too much CPU (the notebook's sweeps, the 06.2 checker), never for what
# runs between a start and its done: labkit.gpt.compile.CUBLAS, several times faster.
COUNTS_VARIANT = "cublas"
SWEPT_KINDS: dict[str, tuple[str, ...]] = {
    "dp": ("all-reduce",),
    "fsdp": ("all-gather", "reduce-scatter"),
}


class StepOptions(TypedDict, total=False):
    """Keyword arguments of :func:`labkit.gpt.compile.compile_train_step` beyond the first
    three, which :func:`sweep_threshold` passes on."""

    batch_size: int
    mesh: Mesh | None
    variant: str


class CompileStep(Protocol):
    """What compiles the GPT step here: :func:`labkit.gpt.compile.compile_train_step` (tests
    pass a fake that returns any object with the program's text as ``.hlo``)."""

    def __call__(
        self,
        cfg: GPTConfig | str,
        strategy: Strategy,
        compiler_options: CompilerOptions | None,
        /,
        **kwargs: Unpack[StepOptions],
    ) -> AotResult: ...


# ---------------------------------------------------------------------------------------
# Combine-threshold sweeps


@dataclasses.dataclass(frozen=True)
class SweepRow:
    """Collectives of one kind in a step compiled with one combine threshold."""

    threshold: int
    kind: str
    count: int
    total_bytes: int
    mean_bytes: float
    max_bytes: int
    sizes: tuple[int, ...]  # bytes of each collective, smallest first
    is_default: bool = False  # the flags were left unset (XLA's default threshold)


def sweep_picture(programs: Mapping[str, Sequence[SweepRow]], title: str) -> Picture:
    """Collectives per step and their mean bytes against the combine threshold, one line per
    collective kind of each swept program (``{"DP, the H100 program": rows, ...}``)."""
    counts, sizes = [], []
    for program, rows in programs.items():
        for kind in dict.fromkeys(r.kind for r in rows):
            mine = sorted((r for r in rows if r.kind == kind), key=lambda r: r.threshold)
            x = [float(r.threshold) for r in mine]
            label = f"{kind} ({program})"
            counts.append(Series(label, x, [float(r.count) for r in mine]))
            sizes.append(Series(label, x, [r.mean_bytes for r in mine]))
    return sweep(
        title,
        "combine threshold (bytes; symlog axis)",
        {"collectives per step": counts, "mean bytes per collective": sizes},
        xscale="symlog",
        x_unit="B",
        y_units={"mean bytes per collective": "B"},
        note="The highest threshold of each line is XLA's default.",
    )


def default_threshold(strategy: Strategy = "dp") -> int:
    """The installed jaxlib's default combine threshold (bytes) for the strategy's collectives."""
    return int(installed_defaults()[THRESHOLD_FLAGS[strategy][0]])


def sweep_threshold(
    thresholds: Sequence[int | None],
    cfg: GPTConfig | str = "tiny",
    strategy: Strategy = "dp",
    *,
    base_options: CompilerOptions | None = None,
    compile_fn: CompileStep | None = None,
    **kwargs: Unpack[StepOptions],
) -> list[SweepRow]:
    """Compile once per threshold (all of the strategy's combine flags set to it) and count.

    ``None`` leaves the flags unset: XLA's default, reported as its value in bytes.
    """
    if strategy not in THRESHOLD_FLAGS:
        raise ValueError(f"strategy must be one of {sorted(THRESHOLD_FLAGS)}, got {strategy!r}")
    compile_fn = compile_fn or compile_train_step
    rows = []
    for threshold in sequence_param(thresholds, "thresholds", "DP_THRESHOLDS", "[0, 4096, null]"):
        options: dict[str, CompilerOption] = dict(base_options or {})
        if threshold is not None:
            options |= dict.fromkeys(THRESHOLD_FLAGS[strategy], int(threshold))
        text = compile_fn(cfg, strategy, options, **kwargs).hlo
        value = default_threshold(strategy) if threshold is None else int(threshold)
        sizes: dict[str, list[int]] = {k: [] for k in SWEPT_KINDS[strategy]}
        for c in hlo.collectives(text):
            if c.kind in sizes:
                sizes[c.kind].append(c.bytes)
        for kind, found in sizes.items():
            mean = sum(found) / len(found) if found else 0.0
            rows.append(
                SweepRow(
                    value,
                    kind,
                    len(found),
                    sum(found),
                    mean,
                    max(found, default=0),
                    tuple(sorted(found)),
                    threshold is None,
                )
            )
    return rows


def counts(rows: Sequence[SweepRow], kind: str) -> list[int]:
    """The collective counts of one kind, in the sweep's threshold order."""
    return [r.count for r in rows if r.kind == kind]


def collective_sizes(text: str) -> list[tuple[str, int]]:
    """Each collective of a compiled program as ``(kind, bytes)``, sorted.

    Two programs with equal lists send the same collectives with the same sizes, whatever
    their kernels: what a faster-to-compile variant must keep to stand in for a count.
    """
    return sorted((c.kind, c.bytes) for c in hlo.collectives(text))


# ---------------------------------------------------------------------------------------
# Reading overlap: the estimate, the model's step, what a scheduler could have overlapped


def overlap_rows(
    estimates: Mapping[str, Sequence[overlap.Estimate]],
) -> list[dict[str, str | int | float]]:
    """One row per program: verdict counts and transfer time split into latency and wire,
    hidden and exposed (microseconds, :func:`labkit.xla.overlap.totals`)."""
    out: list[dict[str, str | int | float]] = []
    for name, found in estimates.items():
        t = overlap.totals(list(found))
        wire = t["transfer_us"] - t["latency_us"]
        us = {"latency_us": t["latency_us"], "wire_us": wire} | {
            k: t[k] for k in ("transfer_us", "hidden_us", "exposed_us")
        }
        row: dict[str, str | int | float] = {"program": name, **overlap.verdicts(list(found))}
        out.append(row | {k: round(v, 2) for k, v in us.items()})
    return out


def prediction_rows(programs: Mapping[str, str]) -> list[dict[str, str | float]]:
    """:func:`labkit.xla.predict.predict`'s terms for several programs side by side:
    ``term``, one column per program (microseconds, or counts), ``how``."""
    found = {name: predict.predict(text).rows() for name, text in programs.items()}
    first = next(iter(found.values()))
    return [
        {"term": row["term"], **{n: rows[i]["us"] for n, rows in found.items()}, "how": row["how"]}
        for i, row in enumerate(first)
    ]


def synchronous(text: str, gpu: str = "H100 SXM") -> list[dict[str, str | int | float | bool]]:
    """Each synchronous collective: its estimated transfer, and the kernels a scheduler could
    have run beside it (:func:`labkit.xla.hlo.independent_kernels`) with their summed
    estimated time (:func:`labkit.xla.overlap.kernel_cost`), in microseconds."""
    module, hw = hlo.parse_module(text), hardware(gpu)
    rows: list[dict[str, str | int | float | bool]] = []
    for e in overlap.estimate(text, hw):
        if e.mode != "sync":
            continue
        insts = {i.name: i for i in module.computations[e.computation]}
        free = [insts[n] for n in hlo.independent_kernels(text, e.name)]
        seconds = sum(overlap.kernel_cost(module, i, hw).seconds for i in free)
        rows.append(
            {
                "collective": e.name,
                "kind": e.kind,
                "computation": e.computation,
                "in_loop": module.called_by(e.computation) == "while",
                "bytes": e.bytes,
                "transfer_us": round(e.transfer_s * 1e6, 3),
                "independent kernels": len(free),
                "independent_us": round(seconds * 1e6, 3),
            }
        )
    return rows


def pack_and_unpack(text: str, start: str) -> tuple[list[str], list[str]]:
    """The kernels that feed an async collective's ``start`` and those that read its done.

    For a merged all-reduce: the fusion that concatenates the gradients into one buffer,
    and one slice per gradient taking its part back out.
    """
    module = hlo.parse_module(text)
    pair = next((p for p in hlo.async_pairs(text) if p.start == start), None)
    if pair is None:
        raise ValueError(f"no async start named {start!r}; names: labkit.xla.hlo.async_pairs")
    insts = {i.name: i for i in module.computations[pair.computation]}
    kernels = [i for i in insts.values() if hlo.is_compute(module, i)]
    feeding = [o for o in insts[start].operands if o in insts and hlo.is_compute(module, insts[o])]
    reading = [i.name for i in kernels if pair.done in i.operands]
    return feeding, reading


# ---------------------------------------------------------------------------------------
# A scanned FSDP layer stack


def compile_scanned_mlp(
    compiler_options: CompilerOptions | None = None,
    layers: int = 4,
    width: int = 1024,
    rows: int = 256,
    num_gpus: int = 8,
) -> AotResult:
    """An FSDP training step of a ``layers``-deep tanh MLP run by ``lax.scan``, compiled.

    The weights, ``(layers, width, width)`` f32, are split over the GPUs on each layer's input
    axis, the batch ``(num_gpus * rows, width)`` on its rows: each iteration of the forward
    loop gathers its layer's weights, and each of the backward loop gathers them again and
    reduce-scatters its gradient. A scanned transformer's FSDP step in a few lines, compiled
    in about a second. Returns the AotResult for ``num_gpus`` H100s (the program as is:
    :func:`labkit.gpt.compile.same_program_options`).
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    mesh = h100_mesh((num_gpus,), ("data",))

    def step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        value, grad = jax.value_and_grad(scanned_tanh_loss)(w, x)
        return w - 0.01 * grad, value  # (layers, width, width), ()

    w = abstract(jax.ShapeDtypeStruct((layers, width, width), jnp.float32), mesh, P(None, "data"))
    x = abstract(jax.ShapeDtypeStruct((num_gpus * rows, width), jnp.float32), mesh, P("data"))
    options = {**same_program_options(), **dict(compiler_options or {})}
    jit_kwargs: JitKwargs = {"out_shardings": (w.sharding, None)}  # the weights stay split
    return compile_for_gpu(step, w, x, compiler_options=options, jit_kwargs=jit_kwargs)


def compile_scanned_mlp_with_xla_flags(
    flags: str | Sequence[str], timeout_s: float = 300.0
) -> FlagCompile:
    """:func:`compile_scanned_mlp` in a fresh process whose XLA_FLAGS are ``flags``.

    Flags are validated first (:func:`labkit.xla.flags.run_with_flags`): a bad one raises
    ``FlagError`` and nothing starts. This process's XLA_FLAGS never change.
    """
    with tempfile.TemporaryDirectory(prefix="labkit-mlp-") as tmp:
        return run_compile_child(flags, __name__, [], Path(tmp) / "step.hlo.txt", timeout_s)


@dataclasses.dataclass(frozen=True)
class PassStep:
    """One HLO pass that changed the module, and the collectives it left (kind: count)."""

    pipeline: str
    name: str
    collectives: dict[str, int]


def traced_scanned_mlp(
    compiler_options: CompilerOptions | None = None,
) -> tuple[AotResult, list[PassStep]]:
    """:func:`compile_scanned_mlp` with XLA's per-pass dumps
    (:func:`labkit.xla.pass_trace.traced`): the compiled program and, in the order XLA ran
    them, the passes that changed the module, each with the collectives it left. A pass that
    changed nothing writes no dump, so it is absent."""

    def compile_with(dump: dict[str, str]) -> AotResult:
        return compile_scanned_mlp({**dict(compiler_options or {}), **dump})

    result, trace = traced(compile_with, "jit_step")
    steps = [
        PassStep(pipe, name, hlo.collective_counts(text))
        for (pipe, name), text in zip(trace.steps, trace.texts, strict=True)
    ]
    return result, steps


def _child(argv: Sequence[str]) -> int:
    """Subprocess side of :func:`compile_scanned_mlp_with_xla_flags`: compile, write, emit."""
    from labkit.core.env import setup

    setup(cpu_devices=8, mode="cpu")  # deviceless H100 compiles need no GPU
    report_compile(compile_scanned_mlp().hlo, Path(argv[0]))
    return 0


# ---------------------------------------------------------------------------------------
# A collective-permute in a loop


def compile_shift_loop(
    compiler_options: CompilerOptions | None = None,
    rows: int = 256,
    steps: int = 4,
    num_gpus: int = 8,
    hidden: int = 16384,
) -> AotResult:
    """A loop that passes a ``(rows, 256)`` f32 block to the next GPU each step, compiled.

    The shape of pipeline parallelism: GPU i sends to i + 1 (no wrap-around) while it runs a
    ``256 -> hidden -> 256`` MLP on data it already has. ``hidden`` sizes that work: at the
    default, its two GEMMs alone take longer than the block's transfer (alpha plus bytes over
    NVLink) by :mod:`labkit.xla.overlap`'s estimate, so a scheduler can hide the transfer
    without decomposing it. Returns the AotResult for ``num_gpus`` H100s. Compiles share
    kernels (:func:`labkit.gpt.compile.same_program_options`: the program stays as is).
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    mesh = h100_mesh((num_gpus,), ("data",))
    shift = [(i, i + 1) for i in range(num_gpus - 1)]

    def body(x: jax.Array, w_in: jax.Array, w_out: jax.Array) -> jax.Array:
        def one(
            carry: tuple[jax.Array, jax.Array], _: None
        ) -> tuple[tuple[jax.Array, jax.Array], None]:
            x, acc = carry  # (rows, 256) each
            sent = jax.lax.ppermute(x, "data", shift)  # to the next GPU
            acc = acc + jnp.tanh(acc @ w_in) @ w_out  # (rows, 256): needs no transfer
            return (sent, acc), None

        (x, acc), _ = jax.lax.scan(one, (x, x), None, length=steps)
        return x + acc  # (rows, 256)

    specs = (P("data"), P(), P())
    fn = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P("data"))
    x = abstract(jax.ShapeDtypeStruct((num_gpus * rows, 256), jnp.float32), mesh, P("data"))
    w_in = abstract(jax.ShapeDtypeStruct((256, hidden), jnp.float32), mesh)
    w_out = abstract(jax.ShapeDtypeStruct((hidden, 256), jnp.float32), mesh)
    options = {**same_program_options(), **dict(compiler_options or {})}
    return compile_for_gpu(fn, x, w_in, w_out, compiler_options=options)


# ---------------------------------------------------------------------------------------
# GPU flags on the CPU


def compile_cpu_sums(
    compiler_options: CompilerOptions | None = None, devices: Sequence[jax.Device] | None = None
) -> str:
    """Two all-reduces of different sizes over CPU devices (default: all), compiled; its HLO.

    The collectives that GPU flags act on (a combine threshold, the scheduler, synchronous
    all-reduces), in a program that compiles for the CPU in a fraction of a second.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from labkit.core.mesh import make_mesh

    devices = list(devices if devices is not None else jax.devices("cpu"))
    mesh = make_mesh((len(devices),), ("data",), devices=devices)

    def sums(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jax.lax.psum(a, "data"), jax.lax.psum(b, "data")  # (1, 64), (1, 4096)

    fn = jax.jit(jax.shard_map(sums, mesh=mesh, in_specs=P("data"), out_specs=P()))
    n = len(devices)
    lowered = fn.lower(jnp.ones((n, 64), jnp.float32), jnp.ones((n, 4096), jnp.float32))
    return str(lowered.compile(compiler_options=dict(compiler_options or {})).as_text())


# ---------------------------------------------------------------------------------------
# The flag explorer

# label -> XLA_FLAGS token; disable_async picks are merged into one list
CHOICES: dict[str, str] = {
    "latency-hiding scheduler off": "--xla_gpu_enable_latency_hiding_scheduler=false",
    "all-reduce synchronous": "--xla_gpu_disable_async_collectives=ALLREDUCE",
    "all-gather synchronous": "--xla_gpu_disable_async_collectives=ALLGATHER",
    "reduce-scatter synchronous": "--xla_gpu_disable_async_collectives=REDUCESCATTER",
    "analytical latency estimator": "--xla_gpu_enable_analytical_latency_estimator=true",
}
DEFAULT = -1  # slider value for "leave the threshold unset"
THRESHOLDS: list[tuple[str, int]] = [("default", DEFAULT), ("0", 0)] + [
    (f"{n >> 10} KiB" if n < 1 << 20 else f"{n >> 20} MiB", n)
    for n in (1 << k for k in range(10, 26, 2))
]


@dataclasses.dataclass(frozen=True)
class FlagDiff:
    """A recompile with ``flags`` against the default program, summarized."""

    flags: tuple[str, ...]
    options: dict[str, CompilerOption]
    diff: dict[str, tuple[int, int]]
    identical: bool

    def table(self) -> str:
        """The changed metrics as a markdown table, or a plain 'no change' line."""
        from labkit.core.report import markdown_table

        if self.identical:
            return "No change: the compiled program is identical to the default one."
        rows = diff_rows(self.diff)
        if not rows:
            return "Same counts, bytes and overlap; the program text differs elsewhere."
        return markdown_table(rows, ["metric", "before", "after"])

    def show(self) -> None:
        """Show the changed metrics as a rendered table, or say in one line what did not change."""
        from labkit.core.report import show_table

        rows = diff_rows(self.diff)
        if self.identical or not rows:
            print(self.table())
        else:
            show_table(rows, ["metric", "before", "after"])


def flag_tokens(
    selected: Sequence[str], threshold: int | None, strategy: Strategy = "dp"
) -> list[str]:
    """XLA_FLAGS tokens for picked ``CHOICES`` labels and a combine threshold (None: default)."""
    unknown = [s for s in selected if s not in CHOICES]
    if unknown:
        raise ValueError(f"unknown choices {unknown}; pick from {list(CHOICES)}")
    tokens, disabled = [], []
    for label in selected:
        name, _, value = CHOICES[label].partition("=")
        if name == "--xla_gpu_disable_async_collectives":
            disabled.append(value)
        else:
            tokens.append(CHOICES[label])
    if disabled:
        tokens.append("--xla_gpu_disable_async_collectives=" + ",".join(disabled))
    if threshold is not None:
        tokens += [f"--{name}={int(threshold)}" for name in THRESHOLD_FLAGS[strategy]]
    return tokens


def flag_diff(
    selected: Sequence[str],
    threshold: int | None = None,
    strategy: Strategy = "dp",
    cfg: GPTConfig | str = "tiny",
    batch_size: int = 32,
    compile_fn: CompileStep | None = None,
) -> FlagDiff:
    """Compile the step with and without the picked flags (per compile) and diff the HLO."""
    compile_fn = compile_fn or compile_train_step
    tokens = flag_tokens(selected, threshold, strategy)
    options = compile_options(tokens) if tokens else {}
    before = compile_fn(cfg, strategy, {}, batch_size=batch_size).hlo
    after = compile_fn(cfg, strategy, options, batch_size=batch_size).hlo
    d = diff(before, after)
    return FlagDiff(tuple(tokens), options, d, identical(before, after))


def flag_explorer(
    strategy: Strategy = "dp",
    cfg: GPTConfig | str = "tiny",
    batch_size: int = 32,
    compile_fn: CompileStep | None = None,
) -> ipywidgets.VBox:
    """Checkboxes, a threshold slider and a button; a click recompiles and shows the diff."""
    import ipywidgets as w
    from IPython.display import Markdown, display

    boxes = [w.Checkbox(value=False, description=label, indent=False) for label in CHOICES]
    slider = w.SelectionSlider(options=THRESHOLDS, value=DEFAULT, description="threshold")
    button = w.Button(description="recompile", button_style="primary")
    out = w.Output()

    def run(_: object) -> None:
        picked = [b.description for b in boxes if b.value]
        with out:
            out.clear_output()
            print(f"compiling the {strategy} step for 8 H100s...")
            threshold = None if slider.value == DEFAULT else slider.value
            result = flag_diff(picked, threshold, strategy, cfg, batch_size, compile_fn)
            out.clear_output()
            print(" ".join(result.flags) or "(no flags: the default program)")
            display(Markdown(result.table()))

    button.on_click(run)
    return w.VBox([*boxes, slider, button, out])


# ---------------------------------------------------------------------------------------
# Exercise checkers


def _compiled_hlo(
    options: CompilerOptions, strategy: Strategy, variant: str = COUNTS_VARIANT
) -> str:
    """The tiny GPT's step for 8 H100s compiled with ``options`` (batch 32), as HLO text."""
    return compile_train_step("tiny", strategy, options, batch_size=32, variant=variant).hlo


def check_sync_gathers(
    answer: object, compile_hlo: Callable[[CompilerOptions], str] | None = None
) -> Feedback:
    """06.1: per-compile options under which the FSDP step's all-gathers and reduce-scatters
    are synchronous and its all-reduce stays async.

    Compiles the FSDP step (the cuBLAS variant: collectives only) with ``answer``;
    ``compile_hlo(options) -> str`` replaces the compile in tests.
    """
    if unanswered(answer):
        return judge("06.1", answer, False, "", "")
    if not isinstance(answer, dict):
        return Feedback("06.1", False, True, f"expected a dict of options, got {answer!r}")
    try:
        text = (compile_hlo or (lambda o: _compiled_hlo(o, "fsdp")))(dict(answer))
    except Exception as exc:  # XLA's JaxRuntimeError for an unknown option or value
        return Feedback("06.1", False, True, f"XLA rejected it: {str(exc).splitlines()[0][:160]}")
    modes = {c.kind: "async" if c.is_async else "sync" for c in hlo.collectives(text)}
    wanted = {"all-gather": "sync", "reduce-scatter": "sync", "all-reduce": "async"}
    return judge(
        "06.1",
        answer,
        modes == wanted,
        "gathers and scatters wait; the all-reduce still overlaps.",
        f"that compiles to {modes}; which option lists the collective types to run "
        "synchronously, and how are the types spelled? (flags.compile_options translates)",
    )


def count_all_reduces(
    threshold: int,
    cfg: GPTConfig | str = "tiny",
    batch_size: int = 32,
    variant: str = COUNTS_VARIANT,
) -> int:
    """All-reduces in the data-parallel GPT step compiled for 8 H100s with this threshold.

    A count of collectives only, so compiled by default as the faster cuBLAS variant
    (:data:`COUNTS_VARIANT`; the notebook checks that it has the H100 program's collectives).
    """
    options = {"xla_gpu_all_reduce_combine_threshold_bytes": int(threshold)}
    compiled = compile_train_step(cfg, "dp", options, batch_size=batch_size, variant=variant)
    return sum(c.kind == "all-reduce" for c in hlo.collectives(compiled.hlo))


def check_two_all_reduce_groups(
    answer: object, count: Callable[[int], int] | None = None, cfg: GPTConfig | str = "tiny"
) -> Feedback:
    """06.2: a combine threshold under which the DP step has exactly two all-reduces.

    Recompiles the step with the answer; ``count(threshold) -> int`` replaces that in tests.
    """
    if unanswered(answer):
        return judge("06.2", answer, False, "", "")
    if isinstance(answer, bool) or not isinstance(answer, int) or answer < 0:
        return Feedback("06.2", False, True, f"expected a number of bytes >= 0, got {answer!r}")
    found = (count or (lambda t: count_all_reduces(t, cfg)))(answer)
    return judge(
        "06.2",
        answer,
        found == 2,
        f"{answer} bytes gives exactly two all-reduces.",
        f"{answer} bytes gives {found} all-reduce(s); two groups must each stay under the "
        "threshold, and one group must not fit: compare with sum(gradient_sizes().values())",
    )


SCHEDULER_OFF_THRESHOLD = 100_000  # 06.3's combine threshold, in bytes


def check_scheduler_off(
    answer: object,
    threshold: int = SCHEDULER_OFF_THRESHOLD,
    compile_hlo: Callable[[CompilerOptions], str] | None = None,
) -> Feedback:
    """06.3: ``(all-reduces, of which synchronous)`` of the DP step (the H100 program) at
    combine ``threshold`` with the latency-hiding scheduler off.

    Compiles the step; ``compile_hlo(options) -> str`` replaces the compile in tests.
    """
    if unanswered(answer):
        return judge("06.3", answer, False, "", "")
    if not (isinstance(answer, tuple) and len(answer) == 2):
        return Feedback("06.3", False, True, f"expected (count, synchronous), got {answer!r}")
    options: CompilerOptions = {
        "xla_gpu_all_reduce_combine_threshold_bytes": threshold,
        "xla_gpu_enable_latency_hiding_scheduler": False,
    }
    text = (compile_hlo or (lambda o: _compiled_hlo(o, "dp", "default")))(options)
    reduces = [c for c in hlo.collectives(text) if c.kind == "all-reduce"]
    expected = (len(reduces), sum(not c.is_async for c in reduces))
    return judge(
        "06.3",
        answer,
        tuple(answer) == expected,
        f"{expected[0]} all-reduces, {expected[1]} of them synchronous.",
        "compile it as section 4 compiled lhs_off, with this threshold; then count the "
        "all-reduces and the rows schedule_table marks 'sync'",
    )


def check_pipelining_options(
    answer: object, compile_hlo: Callable[[CompilerOptions], str] | None = None
) -> Feedback:
    """06.4: per-compile options (no XLA_FLAGS) that pipeline the scanned FSDP all-gathers.

    Compiles the scanned FSDP MLP (:func:`compile_scanned_mlp`) with ``answer`` and looks for
    all-gather starts marked ``"is_pipelined":true``; ``compile_hlo(options) -> str`` replaces
    the compile in tests.
    """
    if unanswered(answer):
        return judge("06.4", answer, False, "", "")
    if not isinstance(answer, dict):
        return Feedback("06.4", False, True, f"expected a dict of options, got {answer!r}")

    def default(options: CompilerOptions) -> str:
        return str(compile_scanned_mlp(options).hlo)

    try:
        text = (compile_hlo or default)(dict(answer))
    except Exception as exc:  # XLA's JaxRuntimeError for an unknown option or value
        return Feedback(
            "06.4",
            False,
            True,
            f"XLA rejected it: {str(exc).splitlines()[0][:160]}. The 2023 names work only in "
            "XLA_FLAGS; per compile use the option they set, with its full enum value "
            "(labkit.xla.flags.compile_options translates)",
        )
    piped = [
        i for i in hlo.instructions(text) if i.opcode == "all-gather-start" and is_pipelined(i)
    ]
    return judge(
        "06.4",
        answer,
        bool(piped),
        f"{len(piped)} pipelined all-gather start(s), without touching XLA_FLAGS.",
        "no all-gather is marked is_pipelined; which DebugOptions field does "
        "--xla_gpu_enable_pipelined_all_gather set? (labkit.xla.flags.describe)",
    )


def check_threshold_zero_count(answer: object, zero_hlo: str) -> Feedback:
    """06.p1 (predict): all-reduces of the DP step compiled at combine threshold 0."""
    expected = hlo.collective_counts(zero_hlo).get("all-reduce", 0)
    return check_integer(
        "06.p1",
        answer,
        expected,
        f"{expected}: nothing merges, so one per gradient, and the loss.",
        "not yet: at 0 nothing merges. What else does a DP step all-reduce besides gradients?",
    )


def check_more_exposed(answer: object, programs: Mapping[str, str]) -> Feedback:
    """06.p2 (predict): which of ``programs`` (name -> compiled HLO) leaves more transfer
    exposed, by :mod:`labkit.xla.overlap`'s estimate."""
    exposed = {n: overlap.totals(overlap.estimate(t))["exposed_us"] for n, t in programs.items()}
    expected = max(exposed, key=lambda n: exposed[n])
    return check_choice(
        "06.p2",
        answer,
        expected,
        {name.lower(): name for name in programs},
        f"{expected}; the next cells show every term.",
        "count the calls: each NCCL call pays alpha, the fixed latency, whatever its bytes",
    )


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
