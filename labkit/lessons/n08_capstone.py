"""08_capstone: train the GPT with a chosen parallelism, precision and flag set; checkpoint,
resume, measure, predict the H100 step, profile, sample; and the exercises' checkers.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Required, TypedDict

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from labkit.core.feedback import (
    Feedback,
    check_choice,
    check_integer,
    check_number,
    judge,
    unanswered,
)
from labkit.core.hardware import LATENCIES
from labkit.core.types import JSON, CompilerOptions, PyTree
from labkit.gpt import data, train
from labkit.gpt.config import GPTConfig, flops_per_token
from labkit.numerics.fp8 import fp8_dot_general
from labkit.numerics.precision import get_policy
from labkit.parallel.sharding import Strategy, as_strategy, strategy_mesh
from labkit.xla import hlo, predict
from labkit.xla.memory import Memory, memory
from labkit.xla.predict import StepPrediction

if TYPE_CHECKING:
    from jax.sharding import Mesh

    from labkit.gpt.model import GPT
    from labkit.xla.aot import AotResult
    from labkit.xla.xla_estimate import XlaEstimate

# Precision name -> (dtype policy of labkit.numerics.precision, FP8 matmuls?), and the H100
# peak used.
PRECISIONS: dict[str, tuple[str, bool]] = {
    "f32": ("float32", False),
    "bf16": ("mixed_bf16", False),
    "fp8": ("mixed_bf16", True),
}
PEAK_OF: dict[str, str] = {"f32": "tf32", "bf16": "bf16", "fp8": "bf16"}  # fp8: fake-quantized
# Flag sets for the H100 compile (per-compile options; see 06_collective_flags).
FLAG_SETS: dict[str, CompilerOptions] = {
    "default": {},
    "no_combine": {
        "xla_gpu_all_reduce_combine_threshold_bytes": 0,
        "xla_gpu_all_gather_combine_threshold_bytes": 0,
        "xla_gpu_reduce_scatter_combine_threshold_bytes": 0,
    },
    "no_lhs": {"xla_gpu_enable_latency_hiding_scheduler": False},
}


def _choice[V](value: str, table: Mapping[str, V], what: str) -> V:
    if value not in table:
        raise ValueError(f"unknown {what} {value!r}; choose one of {sorted(table)}")
    return table[value]


def make_config(preset: str, precision: str) -> GPTConfig:
    """The preset with the dtypes (and FP8 matmuls) of ``precision`` ("f32", "bf16", "fp8")."""
    policy, fp8 = _choice(precision, PRECISIONS, "precision")
    extra = {"dot_general": fp8_dot_general} if fp8 else {}
    return GPTConfig.preset(preset, **get_policy(policy).config_overrides(), **extra)


def make_local_mesh(strategy: Strategy) -> Mesh:
    """The strategy's mesh (:data:`labkit.parallel.sharding.STRATEGY_MESHES`) over this
    machine's devices.

    8 virtual CPUs in CPU mode; with fewer devices (a GPU machine) see
    :func:`labkit.parallel.sharding.strategy_mesh`.
    """
    return strategy_mesh(strategy, jax.devices())


@dataclasses.dataclass
class Run:
    """A compiled train step on local devices, its abstract state and the corpus tokens."""

    cfg: GPTConfig
    strategy: Strategy
    batch_size: int
    compiled: jax.stages.Compiled
    abstract_state: train.State
    abstract_batch: jax.ShapeDtypeStruct
    tokens: np.ndarray
    graphdef: nnx.GraphDef[GPT]
    compile_s: float

    def init(self, seed: int = 0) -> train.State:
        """Fresh params and optimizer state in the step's shardings."""
        return train.init_train_state(self.cfg, self.abstract_state, seed=seed)

    def batch(self, step: int) -> jax.Array:
        """Batch number ``step`` (depends only on the step), placed like the step expects."""
        b = data.batch_at(self.tokens, step, self.batch_size, self.cfg.seq_len)
        return jax.device_put(b, self.abstract_batch.sharding)  # (batch, seq_len + 1)

    def train(
        self,
        state: train.State,
        start: int,
        steps: int,
        on_step: Callable[[int, float, float], None] | None = None,
    ) -> tuple[train.State, list[float], list[float]]:
        """Run steps ``start .. start + steps - 1``; ``(state, losses, seconds per step)``.

        ``on_step(step, loss, seconds)`` is called after each step (a progress display).
        """
        losses, times = [], []
        for i in range(start, start + steps):
            batch = self.batch(i)
            t0 = time.perf_counter()
            state, loss = self.compiled(state, batch)
            losses.append(float(loss))  # waits for the step
            times.append(time.perf_counter() - t0)
            if on_step is not None:
                on_step(i, losses[-1], times[-1])
        return state, losses, times


def build_run(
    preset: str,
    strategy: Strategy,
    precision: str,
    batch_size: int,
    lr: float,
    flags: str = "default",
) -> Run:
    """Compile the pure train step for this machine's mesh of ``strategy`` with a flag set.

    The XLA:CPU compiler accepts the ``xla_gpu_*`` options of :data:`FLAG_SETS` and ignores them.
    """
    cfg = make_config(preset, precision)
    mesh = make_local_mesh(strategy)
    tx = train.make_tx(lr)
    graphdef, state, batch = train.abstract_train_state(cfg, mesh, strategy, batch_size, tx)
    step = train.jit_train_step(graphdef, state, batch, strategy, tx)
    t0 = time.perf_counter()
    compiled = step.lower(state, batch).compile(
        compiler_options=dict(_choice(flags, FLAG_SETS, "flag set"))
    )
    tokens = data.encode(data.corpus())
    return Run(
        cfg,
        strategy,
        batch_size,
        compiled,
        state,
        batch,
        tokens,
        graphdef,
        time.perf_counter() - t0,
    )


def progress_line(step: int, total: int, loss: float, tokens_per_s: float) -> str:
    """One line of the live progress display."""
    return f"step {step + 1:4d}/{total}  loss {loss:7.4f}  {tokens_per_s:9.0f} tokens/s"


# ---------------------------------------------------------------------------------------
# Sampling


def sample(
    run: Run, params: PyTree, prompt: str, num_bytes: int, temperature: float = 0.0, seed: int = 0
) -> str:
    """Generate ``num_bytes`` bytes after ``prompt`` (greedy at temperature 0) on one device."""
    cfg = run.cfg
    host = jax.device_get(params)
    window = cfg.seq_len

    @jax.jit
    def next_logits(p: PyTree, tokens: jax.Array, pos: jax.Array) -> jax.Array:
        model = nnx.merge(run.graphdef, nnx.State(p))
        logits = model(tokens[None, :]).astype(jnp.float32)  # (1, seq, vocab)
        return logits[0, pos]  # (vocab,)

    out = list(data.encode(prompt))
    key = jax.random.key(seed)
    for _ in range(num_bytes):
        ctx = out[-window:]
        tokens = np.zeros(window, np.int32)
        tokens[: len(ctx)] = ctx  # causal: the padding after pos cannot change its logits
        logits = next_logits(host, jnp.asarray(tokens), jnp.int32(len(ctx) - 1))
        if temperature > 0:
            key, sub = jax.random.split(key)
            out.append(int(jax.random.categorical(sub, logits / temperature)))
        else:
            out.append(int(jnp.argmax(logits)))
    return data.decode(out[len(data.encode(prompt)) :])


# ---------------------------------------------------------------------------------------
# Throughput


def model_flops_per_step(cfg: GPTConfig, batch_size: int) -> int:
    """6 N T + attention FLOPs of one step (labkit.gpt.config.flops_per_token x tokens)."""
    return flops_per_token(cfg) * batch_size * cfg.seq_len


# ---------------------------------------------------------------------------------------
# The H100 step time by the kit's model, and XLA's own estimate


def h100_compile(
    preset: str, strategy: Strategy, precision: str, flags: str, batch_size: int
) -> AotResult:
    """The train step compiled for 8 compile-only H100s (labkit.gpt.compile, cached)."""
    from labkit.gpt.compile import compile_train_step

    options = _choice(flags, FLAG_SETS, "flag set")
    return compile_train_step(
        make_config(preset, precision),
        strategy,
        options,
        batch_size=batch_size,
        mesh=strategy_mesh(strategy),
    )


def h100_compile_with_estimate(
    preset: str, strategy: Strategy, precision: str, flags: str, batch_size: int
) -> tuple[AotResult, XlaEstimate | None]:
    """:func:`h100_compile`'s program, compiled once with XLA's scheduler dump on, and XLA's
    own estimate of it read from that dump (:mod:`labkit.xla.xla_estimate`; the dump leaves
    the program as it is). Both are kept in the kit's caches: a second call compiles nothing."""
    from labkit.gpt.compile import same_program_options
    from labkit.xla.xla_estimate import compile_with_estimate

    step, state, batch = h100_setup(preset, strategy, precision, batch_size)
    options = {**same_program_options(), **_choice(flags, FLAG_SETS, "flag set")}
    return compile_with_estimate(step, state, batch, compiler_options=options)


def range_at(text: str, factor: float) -> StepPrediction:
    """The model's step range for ``text`` with both guessed constants (per-kernel floor,
    per-collective alpha) scaled by ``factor`` (unrounded; :func:`predict.sensitivity` rounds)."""
    scaled = dataclasses.replace(
        LATENCIES,
        kernel_floor_us=LATENCIES.kernel_floor_us * factor,
        collective_us=LATENCIES.collective_us * factor,
    )
    return predict.predict(text, latencies=scaled)


def h100_setup(
    preset: str, strategy: Strategy, precision: str, batch_size: int
) -> tuple[jax.stages.Wrapped, train.State, jax.ShapeDtypeStruct]:
    """``(step, abstract_state, abstract_batch)`` of :func:`h100_compile`'s program (cached)."""
    return train.train_setup(
        make_config(preset, precision), strategy_mesh(strategy), strategy, batch_size
    )


def bytes_per_gpu(tree: PyTree) -> int:
    """Bytes one device holds of a tree of arrays or ShapeDtypeStructs (from their shardings)."""
    return sum(
        int(np.prod(x.sharding.shard_shape(x.shape))) * jnp.dtype(x.dtype).itemsize
        for x in jax.tree.leaves(tree)
    )


def compare_configs(
    preset: str, combos: Iterable[tuple[Strategy, str]], batch_size: int, flags: str = "default"
) -> tuple[dict[tuple[Strategy, str], StepPrediction], dict[tuple[Strategy, str], Memory]]:
    """Each ``(strategy, precision)``'s H100 step by the kit's model (:mod:`labkit.xla.predict`) and
    the memory per GPU its compiled program asks for (:mod:`labkit.xla.memory`)."""
    predicted: dict[tuple[Strategy, str], StepPrediction] = {}
    held: dict[tuple[Strategy, str], Memory] = {}
    for strategy, precision in combos:
        result = h100_compile(preset, as_strategy(strategy), precision, flags, batch_size)
        predicted[strategy, precision] = predict.predict(result.hlo)
        held[strategy, precision] = memory(result.compiled)
    return predicted, held


# ---------------------------------------------------------------------------------------
# Profile


class TraceEvent(TypedDict, total=False):
    """A complete event (``ph == "X"``) of a Perfetto JSON trace: times in microseconds."""

    name: Required[str]
    ph: Required[str]
    ts: float
    dur: Required[float]
    pid: int
    tid: int
    args: dict[str, JSON]


def trace_events(trace_dir: str | Path) -> list[TraceEvent]:
    """Complete events (``ph == "X"``) of the Perfetto JSON trace written under ``trace_dir``."""
    files = sorted(Path(trace_dir).rglob("*.trace.json.gz")) + sorted(
        Path(trace_dir).rglob("perfetto_trace.json.gz")
    )
    if not files:
        raise FileNotFoundError(
            f"no *.trace.json.gz under {trace_dir}: use "
            "jax.profiler.trace(dir, create_perfetto_trace=True)"
        )
    with gzip.open(files[0], "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def top_ops(
    events: Iterable[TraceEvent], n: int = 10, python: bool = False, program: str | None = None
) -> list[tuple[str, float, int]]:
    """``(name, total microseconds, count)`` of the ``n`` event names with the most time.

    Python frames (names starting with ``$``, traced by the profiler) are left out unless
    ``python`` is set: they enclose the XLA work rather than doing it. With ``program`` (a
    compiled program's HLO text) only events named after its instructions count: the
    program's own kernels and collectives, not the runtime events that nest around them.
    """
    ops = {i.name for i in hlo.instructions(program)} if program is not None else None
    total: dict[str, float] = {}
    count: Counter[str] = Counter()
    for e in events:
        if not python and str(e["name"]).startswith("$"):
            continue
        if ops is not None and e["name"] not in ops:
            continue
        total[e["name"]] = total.get(e["name"], 0.0) + float(e["dur"])
        count[e["name"]] += 1
    ranked = sorted(total.items(), key=lambda kv: -kv[1])[:n]
    return [(name, us, count[name]) for name, us in ranked]


# ---------------------------------------------------------------------------------------
# Checkers


def check_step_flops(answer: object, preset: str = "small", batch_size: int = 16) -> Feedback:
    """08.1: model FLOPs of one step of ``preset`` at ``batch_size`` (6 N T + attention)."""
    cfg = GPTConfig.preset(preset)
    expected = model_flops_per_step(cfg, batch_size)
    return check_integer(
        "08.1",
        answer,
        expected,
        f"{expected:,} FLOPs: (6 N + 12 L T d) per token x {batch_size * cfg.seq_len} tokens.",
        "flops_per_token(cfg) is 6 x matmul weights + 12 x layers x seq x d_model; multiply by "
        "the tokens of one step (batch x seq_len)",
    )


def check_attention_share(answer: object, preset: str = "small") -> Feedback:
    """08.2: the fraction of ``preset``'s training FLOPs per token spent in attention scores."""
    cfg = GPTConfig.preset(preset)
    attn = 12 * cfg.num_layers * cfg.seq_len * cfg.d_model
    expected = attn / flops_per_token(cfg)
    fb = check_number(
        "08.2",
        answer,
        expected,
        0.01,
        "attention's score and value matmuls cost 12 x num_layers x seq_len x d_model per "
        "token; divide by flops_per_token(cfg)",
    )
    if fb.passed:
        fb = dataclasses.replace(
            fb, message=f"{expected:.3f}: 12 L T d of {flops_per_token(cfg):,} FLOPs per token."
        )
    return fb


def check_best_config(
    answer: object,
    predicted: Mapping[tuple[Strategy, str], StepPrediction],
    held: Mapping[tuple[Strategy, str], Memory],
    limit: float,
) -> Feedback:
    """08.3: the (strategy, precision) with the lowest high end of the model's range within
    ``limit`` bytes per GPU of compiled memory (``Memory.total``)."""
    if unanswered(answer):
        return judge("08.3", answer, False, "", "")
    fits = {k: p.upper_s for k, p in predicted.items() if held[k].total <= limit}
    best = min(fits, key=lambda k: fits[k]) if fits else None
    ok = isinstance(answer, tuple) and tuple(answer) == best
    return judge(
        "08.3",
        answer,
        ok,
        f"right: {best} has the lowest high end of the model's range of the configs that fit.",
        "keep the configs whose compiled memory (held[c].total) is at most the limit, then "
        "take the smallest predicted[c].upper_s; answer a tuple like ('dp', 'bf16')",
    )


BOUND_TERMS = {
    "math": "math",
    "flops": "math",
    "memory": "memory",
    "hbm": "memory",
    "communication": "communication",
    "exposed communication": "communication",
    "exposed": "communication",
    "comm": "communication",
    "floors": "floors",
    "floor": "floors",
    "launches": "floors",
    "kernel launches": "floors",
    "kernels": "floors",
}  # spellings for 08.p1


def check_bound_term(
    answer: object, preset: str, strategy: Strategy, precision: str, flags: str, batch_size: int
) -> Feedback:
    """08.p1 (predict): the term that sets the low end of the model's range for the H100 step:
    "math", "memory" (HBM), "communication" (exposed) or "floors" (one per kernel launched)."""
    if unanswered(answer):
        return judge("08.p1", answer, False, "", "")
    pred = predict.predict(h100_compile(preset, strategy, precision, flags, batch_size).hlo)
    terms = {
        "math": pred.math_s,
        "memory": pred.memory_s,
        "communication": pred.exposed_s,
        "floors": pred.floor_s,
    }
    expected = max(terms, key=lambda t: terms[t])
    return check_choice(
        "08.p1",
        answer,
        expected,
        BOUND_TERMS,
        f"{expected}: the next cell prints every term.",
        "compare a GEMM of this model's size at H100 peak with the 1 us each kernel costs",
    )


def check_bf16_speed(answer: object, preset: str, batch_size: int) -> Feedback:
    """08.p2 (predict): does the kit's model put the bf16 DP step "faster" or "slower" than the f32
    one (high ends of the range) on 8 H100s?"""
    if unanswered(answer):
        return judge("08.p2", answer, False, "", "")
    predicted, _ = compare_configs(preset, [("dp", "f32"), ("dp", "bf16")], batch_size)
    f32, bf16 = predicted["dp", "f32"], predicted["dp", "bf16"]
    expected = "faster" if bf16.upper_s < f32.upper_s else "slower"
    return check_choice(
        "08.p2",
        answer,
        expected,
        {"faster": "faster", "slower": "slower"},
        f"{expected}: {bf16.kernels} kernels against f32's {f32.kernels}.",
        "at this size what sets the step is the kernels it launches; what do casts add?",
    )


# ---------------------------------------------------------------------------------------
# Capstone: a larger preset on 8 H100s, a memory budget, the fastest predicted step


@dataclasses.dataclass(frozen=True)
class Task:
    """The capstone's fixed terms: the model, the global batch, and the budget per GPU."""

    preset: str = "small"
    batch_size: int = 64
    limit_bytes: int = 34_000_000  # compiled memory per GPU (Memory.total) allowed

    def candidates(self) -> list[tuple[Strategy, str, str]]:
        """What the checker compiles to know the best: every strategy and precision with
        the default flags (FP8 is left out: its fake-quantized GEMMs are not faster here)."""
        return [(s, p, "default") for s in ("dp", "fsdp", "tp") for p in ("f32", "bf16")]


CAPSTONE = Task()


@dataclasses.dataclass(frozen=True)
class Standing:
    """One configuration's predicted H100 step and memory, against the task's budget."""

    config: tuple[str, str, str]
    upper_s: float
    lower_s: float
    memory_bytes: int

    def row(self, limit: float) -> dict[str, str | int | float]:
        """A table row: the configuration, its predicted range, its memory, whether it fits."""
        return {
            "strategy/precision/flags": "/".join(self.config),
            "predicted us": f"{predict.round_sig(self.lower_s * 1e6, 3)}-"
            f"{predict.round_sig(self.upper_s * 1e6, 3)}",
            "MB/GPU": round(self.memory_bytes / 1e6, 1),
            "fits": self.memory_bytes <= limit,
        }


def standing(config: tuple[str, str, str], task: Task = CAPSTONE) -> Standing:
    """Compile ``(strategy, precision, flags)`` for 8 H100s (cached) and read its standing."""
    strategy, precision, flags = config
    result = h100_compile(task.preset, as_strategy(strategy), precision, flags, task.batch_size)
    pred = predict.predict(result.hlo)
    return Standing(config, pred.upper_s, pred.lower_s, memory(result.compiled).total)


def check_capstone(answer: object, task: Task = CAPSTONE) -> Feedback:
    """08.4: ``{"strategy", "precision", "flags"}`` with the lowest high end of the model's range on
    8 H100s within ``task.limit_bytes`` per GPU; judged against the best of the answer and
    :meth:`Task.candidates`, all compiled here (within 2% of it passes)."""
    if unanswered(answer):
        return judge("08.4", answer, False, "", "")
    keys = ("strategy", "precision", "flags")
    if not isinstance(answer, dict) or set(answer) != set(keys):
        return Feedback("08.4", False, True, f"answer a dict with the keys {keys}")
    config = (str(answer["strategy"]), str(answer["precision"]), str(answer["flags"]))
    try:
        as_strategy(config[0])
        _choice(config[1], PRECISIONS, "precision")
        _choice(config[2], FLAG_SETS, "flag set")
    except ValueError as exc:
        return Feedback("08.4", False, True, str(exc))
    mine = standing(config, task)
    known = {c: standing(c, task) for c in task.candidates()} | {config: mine}
    fits = sorted(
        (s for s in known.values() if s.memory_bytes <= task.limit_bytes), key=lambda s: s.upper_s
    )
    where = (
        f"{'/'.join(config)}: the model's high end {predict.round_sig(mine.upper_s * 1e6, 3)} us, "
        f"{mine.memory_bytes / 1e6:.1f} MB per GPU"
    )
    if mine.memory_bytes > task.limit_bytes:
        return Feedback(
            "08.4",
            False,
            True,
            f"{where}: over the {task.limit_bytes / 1e6:g} MB "
            "budget. Which choices shrink what each GPU holds, or its temporaries?",
        )
    best = fits[0]
    rank = fits.index(mine) + 1
    standing_text = (
        f"{where}; {rank} of the {len(fits)} fitting configurations the checker compiled "
        f"(best: {'/'.join(best.config)}, {predict.round_sig(best.upper_s * 1e6, 3)} us)"
    )
    return judge(
        "08.4",
        answer,
        mine.upper_s <= best.upper_s * 1.02,
        standing_text,
        standing_text + ". What sets this step's time: math, HBM or kernels, and what adds "
        "kernels?",
    )
