"""06b_scheduler_levers: PGLE profiles, command buffers, windowed einsum, effort levels, NCCL.

The notebook's own code. Every program here is compiled for compile-only H100s
(:mod:`labkit.xla.aot`) with XLA's default options plus what each section changes, and read
with :mod:`labkit.xla.hlo`, judged with :mod:`labkit.xla.overlap` and
:mod:`labkit.xla.predict`; the runtime's thunks come from :mod:`labkit.runtime.thunks`.
Effort levels compile in fresh processes (:func:`start_levels`); GPU measurements run only on GPUs.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import resource
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

from labkit.core.feedback import (
    YES_NO,
    Feedback,
    check_choice,
    check_integer,
    judge,
    unanswered,
)
from labkit.core.hardware import hardware
from labkit.core.mesh import abstract
from labkit.core.timing import Timing, sequence_param, timeit
from labkit.core.types import CompilerOption, CompilerOptions
from labkit.gpt.compile import same_program_options
from labkit.parallel.sharding import scanned_tanh_loss
from labkit.xla import hlo, overlap
from labkit.xla.aot import AotResult, compile_for_gpu, h100_mesh
from labkit.xla.compare import identical, metrics
from labkit.xla.flags import default_of, emit, run_with_flags

if TYPE_CHECKING:
    import jax
    from jax.sharding import Mesh

    from labkit.xla.xla_estimate import XlaEstimate

type ProfileOptions = Mapping[str, CompilerOption | bytes]
"""Compiler options that may carry a PGLE profile: ``fdo_profile`` is the one option JAX takes
as bytes (it hands it to the executable build, not to XLA's debug options)."""
type MlpStep = Callable[[list[jax.Array], jax.Array], tuple[jax.Array, list[jax.Array]]]
THRESH = "xla_gpu_all_reduce_combine_threshold_bytes"
PGLE_PATH = "xla_gpu_pgle_profile_file_or_directory_path"
PGLE_CHECKER = "xla_gpu_pgle_accuracy_checker"
COMMAND_BUFFER = "xla_gpu_enable_command_buffer"
GRAPH_MIN = "xla_gpu_graph_min_graph_size"
WINDOWED = "xla_gpu_threshold_for_windowed_einsum_mib"
MULTI_STREAM = "xla_gpu_multi_streamed_windowed_einsum"
LEVELS = ("O0", "O1", "O2", "O3")
CHECKER_LEVELS = tuple(f"PGLE_STRICTNESS_LEVEL_{x}" for x in ("OFF", "WARN", "ERROR"))

# Every XLA flag the notebook uses or names, with a value to check it with: a test runs them
# through labkit.xla.flags.validate, so a flag that this jaxlib no longer knows fails CI.
FLAGS: dict[str, str] = {
    THRESH: "0",
    PGLE_PATH: "/tmp/profile.pbtxt",
    PGLE_CHECKER: "PGLE_STRICTNESS_LEVEL_ERROR",
    COMMAND_BUFFER: "",
    GRAPH_MIN: "100",
    WINDOWED: "0",
    MULTI_STREAM: "false",
    "xla_gpu_operand_bytes_threshold_for_windowed_einsum": "0",
    "xla_gpu_enable_analytical_sol_latency_estimator": "true",
    "xla_gpu_command_buffer_update_mode": "ALWAYS_UPDATE",
    "xla_disable_hlo_passes": "dot-merger",
    "xla_dump_to": "/tmp/dump",
    "xla_dump_hlo_pass_re": "^$",
}
# Flags the notebook names as gone: the same test checks that this jaxlib rejects them.
REMOVED_FLAGS: dict[str, str] = {"xla_gpu_graph_level": "0"}


# ---------------------------------------------------------------------------------------
# The program: a data-parallel MLP step for 8 H100s


def mlp_train_step(ws: list[jax.Array], x: jax.Array) -> tuple[jax.Array, list[jax.Array]]:
    """One SGD step of a tanh MLP with weights ``ws``: ``(loss, new weights)``."""
    import jax
    import jax.numpy as jnp

    def loss(ws: list[jax.Array], x: jax.Array) -> jax.Array:
        for w in ws:
            x = jnp.tanh(x @ w)  # (batch, width)
        return jnp.mean(x * x)

    value, grads = jax.value_and_grad(loss)(ws, x)
    return value, [w - 0.01 * g for w, g in zip(ws, grads, strict=True)]


def mlp_step(
    width: int = 256, layers: int = 4, batch: int = 256, num_gpus: int = 8
) -> tuple[MlpStep, list[jax.ShapeDtypeStruct], jax.ShapeDtypeStruct]:
    """``(step, ws, x)``: :func:`mlp_train_step` data parallel on ``num_gpus`` H100s.

    ``ws`` are ``layers`` replicated ``(width, width)`` bf16 weights, ``x`` a ``(batch, width)``
    bf16 batch split over the GPUs; every gradient is summed across them.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    mesh = h100_mesh((num_gpus,), ("data",))
    w = jax.ShapeDtypeStruct((width, width), jnp.bfloat16)
    ws = [abstract(w, mesh) for _ in range(layers)]
    xs = abstract(jax.ShapeDtypeStruct((batch, width), jnp.bfloat16), mesh, P("data"))
    return mlp_train_step, ws, xs


def _key(options: ProfileOptions) -> tuple[tuple[str, CompilerOption | bytes], ...]:
    return tuple(sorted(options.items()))


@functools.lru_cache(maxsize=32)
def _compile_mlp(
    width: int, layers: int, batch: int, options: tuple[tuple[str, CompilerOption | bytes], ...]
) -> AotResult:
    step, ws, x = mlp_step(width, layers, batch)
    return compile_for_gpu(step, ws, x, compiler_options=dict(options))


def compile_mlp(
    options: ProfileOptions | None = None,
    *,
    width: int = 256,
    layers: int = 4,
    batch: int = 256,
    threshold: int | None = 0,
) -> AotResult:
    """The MLP step compiled for 8 H100s: XLA's defaults, all-reduces not combined
    (``threshold`` 0: one per gradient; None: XLA's default threshold), plus ``options``.

    Options that leave the program as it is (:func:`labkit.gpt.compile.same_program_options`)
    are added; results are cached per process on the whole configuration.
    """
    merged: dict[str, CompilerOption | bytes] = dict(same_program_options())
    if threshold is not None:
        merged[THRESH] = int(threshold)
    merged.update(options or {})
    return _compile_mlp(width, layers, batch, _key(merged))


# ---------------------------------------------------------------------------------------
# PGLE: a profile of costs by instruction name


def profile_text(costs: Mapping[str, float], note: str = "SYNTHETIC: written, not measured") -> str:
    """A ``ProfiledInstructionsProto`` in text form: one ``costs`` entry per instruction name
    (microseconds), headed by a ``#`` comment saying where the numbers come from."""
    if not costs:
        raise ValueError("a profile needs at least one {instruction name: cost in us} entry")
    lines = [f"# {note}"]
    for name, cost in costs.items():
        if not isinstance(name, str) or not name or '"' in name:
            raise ValueError(f"instruction names are plain HLO names like 'fusion.3', got {name!r}")
        lines.append(f'costs {{ name: "{name}" cost_us: {float(cost):g} }}')
    return "\n".join(lines) + "\n"


def write_profile(costs: Mapping[str, float], folder: str | Path, name: str = "synthetic") -> Path:
    """Write :func:`profile_text` to ``folder/<name>.pbtxt`` (XLA reads ``.pbtxt`` as text)."""
    path = Path(folder) / f"{name}.pbtxt"
    path.write_text(profile_text(costs))
    return path


def kernels_between(text: str, start: str) -> list[str]:
    """Names of the compute kernels scheduled between async ``start`` and its done."""
    module = hlo.parse_module(text)
    by_name = {i.name: i for i in hlo.instructions(text)}
    for pair in hlo.async_pairs(text):
        if pair.start == start:
            return [n for n in pair.ops_between if hlo.is_compute(module, by_name[n])]
    raise ValueError(f"{start!r} is no async start in this program (a sync one has no pair)")


def schedule_rows(programs: Mapping[str, str]) -> list[dict[str, str]]:
    """One row per all-reduce of the first program: in each program, ``async (n)`` with the
    number of kernels between its start and done, or ``sync`` when it has no pair there."""
    names = list(programs)
    first = hlo.async_pairs(programs[names[0]])
    pairs = {n: {p.start: p for p in hlo.async_pairs(t)} for n, t in programs.items()}
    rows = []
    for base in first:
        row = {"all-reduce": base.start}
        for n in names:
            p = pairs[n].get(base.start)
            row[n] = f"async ({p.compute_between})" if p else "sync"
        rows.append(row)
    return rows


def between_counts(text: str) -> dict[str, int]:
    """Each async collective start and the number of kernels between it and its done."""
    return {p.start: p.compute_between for p in hlo.async_pairs(text) if p.is_collective}


def sync_collectives(text: str) -> list[str]:
    """Names of the collectives that run synchronously (no start/done pair)."""
    return [c.name for c in hlo.collectives(text) if not c.is_async]


def recorded_profile(text: str, gpu: str = "H100 SXM") -> dict[str, float]:
    """A stand-in for the profile a GPU would record of ``text``: every kernel and collective
    of the *final* program by its final name, with the overlap model's time as its cost.

    SYNTHETIC: the names are what a profile of this program carries (the runtime annotates
    each thunk with its HLO name, :func:`labkit.runtime.thunks.profile_annotations`); the costs are
    estimates (:func:`labkit.xla.overlap.kernel_cost`, transfer times of
    :func:`labkit.xla.overlap.estimate`), not measurements.
    """
    module = hlo.parse_module(text)
    hw = hardware(gpu)
    costs: dict[str, float] = {}
    for inst in module.computations[module.entry]:
        if hlo.is_compute(module, inst):
            costs[inst.name] = overlap.kernel_cost(module, inst, hw).seconds * 1e6
    for e in overlap.estimate(text, hw):
        costs[e.name] = e.transfer_s * 1e6
    return {k: round(v, 3) for k, v in costs.items()}


def missing_instructions(message: str) -> int:
    """N of XLA's 'Found N missing instructions' (the PGLE accuracy checker's error)."""
    m = re.search(r"Found (\d+) missing instructions", message)
    if m is None:
        raise ValueError(f"not a PGLE accuracy-checker error: {message[:200]!r}")
    return int(m.group(1))


def verdict_rows(programs: Mapping[str, str]) -> list[dict[str, str | int | float]]:
    """Per program: the overlap verdicts, transfer totals (us) and the model's range of the step."""
    from labkit.xla.predict import predict, round_sig

    rows: list[dict[str, str | int | float]] = []
    for name, text in programs.items():
        found = overlap.estimate(text)
        totals = overlap.totals(found)
        p = predict(text)
        rows.append(
            {
                "program": name,
                **overlap.verdicts(found),
                "hidden us": round(totals["hidden_us"], 2),
                "exposed us": round(totals["exposed_us"], 2),
                "step us (model)": f"{round_sig(p.lower_s * 1e6)}-{round_sig(p.upper_s * 1e6)}",
            }
        )
    return rows


def measure_auto_pgle(
    profiling_runs: int = 2, repeats: int = 20, width: int = 4096, layers: int = 8
) -> dict[str, Timing]:
    """On this machine's GPUs: the MLP step timed without PGLE, then with JAX's automatic
    PGLE (``jax_enable_pgle``: ``profiling_runs`` profiled calls, then the recompiled step).

    Raises RuntimeError without GPUs: nothing here is simulated.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = jax.devices()
    if devices[0].platform != "gpu":
        raise RuntimeError("automatic PGLE needs GPUs: run this on a GPU machine (MODE gpu)")
    mesh = jax.make_mesh((len(devices),), ("data",), devices=devices)
    batch = 64 * len(devices)
    keys = jax.random.split(jax.random.key(0), layers + 1)
    rep, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    ws = [jax.device_put(jax.random.normal(k, (width, width), jnp.bfloat16), rep) for k in keys[1:]]
    x = jax.device_put(jax.random.normal(keys[0], (batch, width), jnp.bfloat16), split)
    options = {THRESH: 0}
    plain = jax.jit(mlp_train_step, compiler_options=options)
    times = {"PGLE off": timeit(plain, ws, x, repeats=repeats)}
    old = (jax.config.jax_enable_pgle, jax.config.jax_pgle_profiling_runs)
    jax.config.update("jax_enable_pgle", True)
    jax.config.update("jax_pgle_profiling_runs", profiling_runs)
    try:
        guided = jax.jit(mlp_train_step, compiler_options=options)
        for _ in range(profiling_runs):  # profiled calls; the next call recompiles
            jax.block_until_ready(guided(ws, x))
        times["automatic PGLE"] = timeit(guided, ws, x, repeats=repeats)
    finally:
        jax.config.update("jax_enable_pgle", old[0])
        jax.config.update("jax_pgle_profiling_runs", old[1])
    return times


def thunk_rows(sequence: str) -> list[dict[str, str | int]]:
    """One row per top-level thunk of a dumped sequence: what the host launches, in order."""
    from labkit.runtime.thunks import command_buffers, parse_thunk_sequence

    seq = parse_thunk_sequence(sequence)
    graphs = {g.position: g for g in command_buffers(seq)}
    rows: list[dict[str, str | int]] = []
    for t in seq:
        if t.depth:
            continue
        if t.position in graphs:
            kinds = graphs[t.position].kinds
            what = ", ".join(f"{n} x {k}" for k, n in sorted(kinds.items()))
        else:
            inner = [c.kind for c in seq if c.parent == t.position and c.depth]
            what = t.name or ", ".join(inner)
        rows.append({"launch": len(rows) + 1, "thunk": t.kind, "runs": what})
    return rows


# ---------------------------------------------------------------------------------------
# Windowed einsum and a hand-written collective matmul


def ring_matmul(x: jax.Array, w: jax.Array, axis: str = "x") -> jax.Array:
    """``all_gather(x) @ w`` per device, the gather done as ``n - 1`` ring steps in a loop.

    Inside ``shard_map``: ``x`` is this device's ``(rows, k)`` block of rows, ``w`` its
    ``(k, cols)`` block of columns. Each step passes the block it holds to the next device
    while it multiplies that block, so the scheduler can put each transfer beside a GEMM.
    Returns ``(n * rows, cols)``. :func:`ring_matmul_unrolled` is the same with the loop
    unrolled.
    """
    import jax
    import jax.numpy as jnp

    n, me, rows = jax.lax.axis_size(axis), jax.lax.axis_index(axis), x.shape[0]
    perm = [(i, (i + 1) % n) for i in range(n)]  # device i sends to i + 1

    def place(out: jax.Array, block: jax.Array, s: jax.Array | int) -> jax.Array:
        # block came from device (me - s) % n
        return jax.lax.dynamic_update_slice_in_dim(out, block @ w, ((me - s) % n) * rows, 0)

    def step(s: jax.Array, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        block, out = carry  # (rows, k), (n * rows, cols)
        return jax.lax.ppermute(block, axis, perm), place(out, block, s)

    out = jax.lax.pcast(jnp.zeros((n * rows, w.shape[1]), x.dtype), axis, to="varying")
    block, out = jax.lax.fori_loop(0, n - 1, step, (x, out))
    return place(out, block, n - 1)


def ring_matmul_unrolled(x: jax.Array, w: jax.Array, axis: str = "x") -> jax.Array:
    """:func:`ring_matmul` with its ``n - 1`` steps unrolled in Python (``n`` is static)."""
    import jax
    import jax.numpy as jnp

    n, me, rows = jax.lax.axis_size(axis), jax.lax.axis_index(axis), x.shape[0]
    perm = [(i, (i + 1) % n) for i in range(n)]
    out = jax.lax.pcast(jnp.zeros((n * rows, w.shape[1]), x.dtype), axis, to="varying")
    block = x
    for s in range(n):
        start = ((me - s) % n) * rows
        out = jax.lax.dynamic_update_slice_in_dim(out, block @ w, start, 0)
        block = jax.lax.ppermute(block, axis, perm) if s < n - 1 else block
    return out


def matmul_inputs(
    m: int, k: int, n: int, num_gpus: int = 8
) -> tuple[Mesh, jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    """``(mesh, x, w)``: bf16 ``x (m, k)`` split by rows, ``w (k, n)`` by columns, on H100s."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    mesh = h100_mesh((num_gpus,), ("x",))
    x = abstract(jax.ShapeDtypeStruct((m, k), jnp.bfloat16), mesh, P("x", None))
    w = abstract(jax.ShapeDtypeStruct((k, n), jnp.bfloat16), mesh, P(None, "x"))
    return mesh, x, w


def compile_xla_matmul(m: int, k: int, n: int, options: CompilerOptions | None = None) -> AotResult:
    """``x @ w`` left to XLA (result split by columns), compiled for 8 H100s with ``options``."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh, x, w = matmul_inputs(m, k, n)
    fn = jax.jit(lambda x, w: x @ w, out_shardings=NamedSharding(mesh, P(None, "x")))
    merged = {**same_program_options(), **dict(options or {})}
    return compile_for_gpu(fn, x, w, compiler_options=merged)


def compile_ring_matmul(
    m: int,
    k: int,
    n: int,
    fn: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
    options: CompilerOptions | None = None,
) -> AotResult:
    """``fn`` (default :func:`ring_matmul`) under ``shard_map``, compiled for 8 H100s with
    XLA's defaults plus ``options``."""
    import jax
    from jax.sharding import PartitionSpec as P

    mesh, x, w = matmul_inputs(m, k, n)
    body = fn or ring_matmul
    specs = (P("x", None), P(None, "x"))
    mapped = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(None, "x")))
    merged = {**same_program_options(), **dict(options or {})}
    return compile_for_gpu(mapped, x, w, compiler_options=merged)


def _loop_trips(insts: Sequence[hlo.Instruction]) -> str:
    """Each ``while`` loop's trip count, comma-separated ("?": unknown; "-": no loop)."""
    trips = [
        "?" if i.trip_count is None else str(i.trip_count) for i in insts if i.opcode == "while"
    ]
    return ",".join(trips) or "-"


def dus_bytes(text: str) -> dict[str, int]:
    """What the model charges the first dynamic-update-slice fusion of a compiled program, and
    its parts: ``charged`` (the model's HBM bytes), ``operand`` and ``output`` (the whole
    buffer updated, read and written), ``partials`` (the other array operands: here the f32
    split-K partials it sums) and ``update`` (the slice an in-place update writes)."""
    from labkit.xla.hlo_text import parse_module, shape_bytes

    module = parse_module(text)
    for comp, insts in module.computations.items():
        shapes = module.shapes(comp)
        for inst in insts:
            called = [
                c for name in inst.callees("calls") for c in module.computations.get(name, ())
            ]
            dus = [c for c in called if c.opcode == "dynamic-update-slice"]
            if inst.opcode != "fusion" or not dus:
                continue
            update = {c.name: c.shape for c in called}.get(dus[0].operands[1], "")
            arrays = [shapes.get(o, "") for o in inst.operands if "[]" not in shapes.get(o, "[]")]
            cost = overlap.kernel_cost(module, inst, hardware("H100 SXM"))
            return {
                "charged": int(cost.hbm_bytes),
                "operand": shape_bytes(arrays[0]),
                "output": shape_bytes(inst.shape),
                "partials": sum(shape_bytes(a) for a in arrays[1:]),
                "update": shape_bytes(update),
            }
    raise ValueError("no dynamic-update-slice fusion in this program")


def matmul_rows(programs: Mapping[str, str]) -> list[dict[str, str | int | float]]:
    """Per program: loops, collectives (async/sync), GEMMs, what the model predicts."""
    from labkit.xla.predict import predict, round_sig

    rows: list[dict[str, str | int | float]] = []
    for name, text in programs.items():
        colls = hlo.collectives(text)
        p = predict(text)
        gemms = sum(n for k, n in hlo.kernel_counts(text).items() if "gemm" in k or "cublas" in k)
        rows.append(
            {
                "program": name,
                "loop trips": _loop_trips(hlo.instructions(text)),
                "collectives": ", ".join(
                    f"{n} {k}" for k, n in Counter(c.kind for c in colls).items()
                ),
                "async": sum(c.is_async for c in colls),
                "sync": sum(not c.is_async for c in colls),
                "GEMM kernels": gemms,
                "kernels run": p.kernels,
                "exposed us": round_sig(p.exposed_s * 1e6),
                "step us (model)": f"{round_sig(p.lower_s * 1e6)}-{round_sig(p.upper_s * 1e6)}",
            }
        )
    return rows


# ---------------------------------------------------------------------------------------
# Effort levels: jax_optimization_level in fresh processes


def scanned_step(
    layers: int = 4, width: int = 512, batch: int = 256
) -> tuple[jax.stages.Wrapped, jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    """``(step, ws, x)``: an FSDP step of a scanned tanh MLP on 8 H100s (weights split by rows,
    one ``all-gather`` and ``reduce-scatter`` per layer inside the loop)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    mesh = h100_mesh((8,), ("data",))

    def step(ws: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        value, grads = jax.value_and_grad(scanned_tanh_loss)(ws, x)
        return value, ws - 0.01 * grads

    w = abstract(jax.ShapeDtypeStruct((layers, width, width), jnp.bfloat16), mesh, P(None, "data"))
    x = abstract(jax.ShapeDtypeStruct((batch, width), jnp.bfloat16), mesh, P("data"))
    return jax.jit(step), w, x


class _LevelResult(TypedDict):
    """What :func:`_level_child` emits."""

    wall_s: float
    cpu_s: float
    metrics: dict[str, int]


class _NcclResult(TypedDict):
    """What :func:`_nccl_child` emits."""

    median_s: float
    devices: int


@dataclasses.dataclass(frozen=True)
class LevelCompile:
    """The scanned step compiled in a fresh process at one level.

    ``hlo`` is the first compile, at ``jax_optimization_level`` = ``level`` (timed: cold, like
    a user's first step); ``memory_hlo`` a second one in the same process at the default
    optimization level with ``memory_fitting_level`` = ``level`` per compile (not timed).
    """

    level: str
    wall_s: float
    cpu_s: float  # this process and its children (ptxas), during the compile
    metrics: dict[str, int]
    hlo: str
    memory_hlo: str


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _level_child(argv: Sequence[str]) -> int:
    """Subprocess side of :func:`start_levels`: compile twice, write both HLOs, emit numbers."""
    import jax

    from labkit.core.env import setup

    spec, out = json.loads(argv[0]), Path(argv[1])
    setup(cpu_devices=8, mode="cpu")
    step, w, x = scanned_step(spec["layers"], spec["width"], spec["batch"])
    wall, cpu = time.perf_counter(), _cpu_seconds()  # timed: a fresh compile, not a stored one
    options = same_program_options()  # untuned tiles, as stale_level_compile (its docstring)
    result = compile_for_gpu(step, w, x, compiler_options=options, cache=False, tiles="untuned")
    wall, cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
    out.with_suffix(".opt.txt").write_text(result.hlo)
    jax.config.update("jax_optimization_level", "UNKNOWN")  # JAX's default
    memory = {**same_program_options(), "memory_fitting_level": spec["level"]}
    mem = compile_for_gpu(step, w, x, compiler_options=memory, tiles="untuned")
    out.with_suffix(".mem.txt").write_text(mem.hlo)
    emit(_LevelResult(wall_s=wall, cpu_s=cpu, metrics=metrics(result.hlo)))
    return 0


def start_levels(
    levels: Sequence[str] = LEVELS,
    folder: str | Path | None = None,
    *,
    layers: int = 4,
    width: int = 512,
    batch: int = 256,
    parallel: int = 1,
    timeout_s: float = 300.0,
) -> Future[list[LevelCompile]]:
    """Start compiling the scanned step once per level, each in a fresh process whose
    environment sets ``JAX_OPTIMIZATION_LEVEL`` (no cache of this process can answer it),
    ``parallel`` at a time; returns at once with a future of the results, in level order.

    The children run beside whatever this process does next: compare their CPU seconds,
    which a busy machine does not inflate; wall seconds depend on the load.
    """
    from labkit.core.env import scratch_dir

    levels = sequence_param(levels, "levels", "LEVELS", '["O0", "O1"]')
    unknown = [lv for lv in levels if lv not in LEVELS]
    if unknown:
        raise ValueError(f"levels {unknown} unknown; jax_optimization_level takes {list(LEVELS)}")
    where = Path(folder) if folder is not None else scratch_dir("labkit-levels-")

    def one(level: str) -> LevelCompile:
        spec = json.dumps({"layers": layers, "width": width, "batch": batch, "level": level})
        out = where / level
        run = run_with_flags(
            [],
            module=__name__,
            args=["levels", spec, str(out)],
            env={"JAX_OPTIMIZATION_LEVEL": level},
            timeout_s=timeout_s,
        )
        if run.returncode != 0 or not isinstance(run.result, dict):
            raise RuntimeError(
                f"the {level} compile failed (exit {run.returncode}):\n{run.stderr[-1500:]}"
            )
        r = cast("_LevelResult", run.result)  # what _level_child emits
        opt, mem = out.with_suffix(".opt.txt"), out.with_suffix(".mem.txt")
        return LevelCompile(
            level, r["wall_s"], r["cpu_s"], r["metrics"], opt.read_text(), mem.read_text()
        )

    def every() -> list[LevelCompile]:
        with ThreadPoolExecutor(max(1, parallel)) as inner:  # threads only wait for children
            return list(inner.map(one, levels))

    pool = ThreadPoolExecutor(1)
    future = pool.submit(every)
    pool.shutdown(wait=False)  # the future still completes; nothing else goes to this pool
    return future


def level_rows(
    results: Sequence[LevelCompile], default_hlo: str
) -> list[dict[str, str | int | float | bool]]:
    """Per level: compile time, what the program holds, whether it is JAX's default program,
    and whether the memory-fitting level alone changed the default program."""
    rows: list[dict[str, str | int | float | bool]] = []
    for r in results:
        insts = hlo.instructions(r.hlo)
        rows.append(
            {
                "level": r.level,
                "compile CPU s": round(r.cpu_s, 2),
                "compile wall s": round(r.wall_s, 2),
                "instructions": r.metrics["instructions"],
                "loop trips": _loop_trips(insts),
                "double-buffer clones": sum("double_buffer" in i.name for i in insts),
                "async": r.metrics["async collectives"],
                "sync": r.metrics["sync collectives"],
                "pipelined": r.metrics["pipelined"],
                "= default program": identical(default_hlo, r.hlo),
                "memory level = default program": identical(default_hlo, r.memory_hlo),
            }
        )
    return rows


def stale_level_compile(level: str = "O1") -> tuple[AotResult, AotResult, float]:
    """The scanned step compiled in *this* process, then ``jax_optimization_level`` set to
    ``level`` and the same jitted step lowered and compiled again: ``(before, after,
    seconds the second compile took)``. The setting is restored afterwards.

    Both compiles keep XLA's untuned GEMM tiles: a rule compile (:mod:`labkit.xla.tiles`)
    hands XLA a fresh autotune-results folder each time, so JAX's in-process cache, which
    this shows, never serves it, and the level takes effect (under O1 the step has 4 GEMM
    fusions instead of 3). :func:`start_levels` compiles untuned too, to compare the same.
    """
    import jax

    step, w, x = scanned_step()
    # cache=False: both compiles are this process's own (the kit's compile cache would serve
    # each from disk under its own key, and this shows JAX's in-process cache)
    options = same_program_options()
    before = compile_for_gpu(step, w, x, compiler_options=options, cache=False, tiles="untuned")
    old = jax.config.jax_optimization_level
    jax.config.update("jax_optimization_level", level)
    try:
        start = time.perf_counter()
        after = compile_for_gpu(step, w, x, compiler_options=options, cache=False, tiles="untuned")
        seconds = time.perf_counter() - start
    finally:
        jax.config.update("jax_optimization_level", old)
    return before, after, seconds


def level_per_compile(
    level: str = "O1", layers: int = 4, width: int = 512, batch: int = 256
) -> AotResult:
    """The scanned step compiled in *this* process with ``optimization_level`` = ``level`` as
    a compiler option: JAX moves it onto XLA's build options for this compile alone
    (``jax/_src/compiler.py``, ``overrides_on_build_options``), and JAX's in-process cache keys
    on the options passed, so a cached default program cannot come back. Untuned tiles and
    no kit cache, as :func:`stale_level_compile` and :func:`start_levels` compile."""
    step, w, x = scanned_step(layers, width, batch)
    options = {**same_program_options(), "optimization_level": level}
    return compile_for_gpu(step, w, x, compiler_options=options, cache=False, tiles="untuned")


# ---------------------------------------------------------------------------------------
# NCCL's own knobs

NCCL_DOCS = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
NCCL_KNOBS: list[dict[str, str]] = [
    {
        "variable": "NCCL_NVLS_ENABLE",
        "what": "NVLink SHARP: all-reduces done in the NVSwitch (multicast memory), on NVSwitch "
        "systems such as 8-GPU HGX H100; 0 turns it off",
        "why people set it": "0 where the fabric manager or container lacks multicast support "
        "(NCCL's own warning: 'Disable NVLS (NCCL_NVLS_ENABLE=0) if you wish to avoid this error')",
        "source": NCCL_DOCS,
    },
    {
        "variable": "NCCL_PROTO",
        "what": "which protocols NCCL may use: LL, LL128, Simple (latency vs bandwidth); "
        "unset, NCCL picks per call",
        "why people set it": "to rule one out while debugging; NCCL's page says its debugging "
        "variables should not stay set in production ('sub-optimal behavior, crashes, or hangs')",
        "source": NCCL_DOCS,
    },
    {
        "variable": "NCCL_ALGO",
        "what": "which algorithms NCCL may use (Ring, Tree, NVLS, ...); unset, NCCL picks per call",
        "why people set it": "the same: comparison and debugging",
        "source": NCCL_DOCS,
    },
]


def nvls_rows(sizes: Sequence[int], n: int = 8, gpu: str = "H100 SXM") -> list[dict[str, object]]:
    """Per all-reduce size (bytes): the kit's ring (:mod:`labkit.xla.overlap`: alpha + a ring's
    bytes over NVLink) beside NCCL's own model of a ring and of NVLS
    (:mod:`labkit.core.nccl_model`), microseconds, rounded. ``ring bytes sent``: what each GPU
    of a ring sends; ``NVLS ring-equivalent bytes``: the ring's bytes divided by NCCL's factor
    of 2 on NVLS's bus bandwidth, what a ring at NVLS's speed would send (NCCL's tuner models
    time, not NVLS's traffic)."""
    from labkit.core import nccl_model
    from labkit.core.hardware import LATENCIES
    from labkit.xla.predict import round_sig

    link = (hardware(gpu).nvlink_gbps or 0.0) / 2
    rows: list[dict[str, object]] = []
    for size in sizes:
        wire = overlap.link_bytes("all-reduce", size, n)
        ring, nvls = (nccl_model.all_reduce(size, n, a) for a in ("ring", "nvls"))
        rows.append(
            {
                "bytes": size,
                "kit ring us": round_sig(LATENCIES.collective_us + wire / (link * 1e3)),
                "NCCL ring us": round_sig(ring.us),
                "NCCL NVLS us": round_sig(nvls.us),
                "ring bytes sent": round(ring.wire_bytes),
                "NVLS ring-equivalent bytes": round(nvls.wire_bytes),
            }
        )
    return rows


def sol_rows(text: str, est: XlaEstimate) -> list[dict[str, object]]:
    """Per collective of ``text``: the kit's transfer time and verdict beside XLA's window for
    it in its own schedule (its SOL estimator's times: :mod:`labkit.xla.xla_estimate`)."""
    from labkit.xla.predict import round_sig

    rows: list[dict[str, object]] = []
    for e in overlap.estimate(text):
        op = est.op(e.name)
        rows.append(
            {
                "collective": e.name,
                "bytes": e.bytes,
                "kit transfer us": round_sig(e.transfer_s * 1e6),
                "kit verdict": e.verdict,
                "XLA window us": "-" if op is None else round_sig(op.us),
                "XLA's model": "-" if op is None else op.source,
            }
        )
    return rows


NCCL_SETTINGS: dict[str, dict[str, str]] = {
    "NCCL defaults": {},
    "NVLS off": {"NCCL_NVLS_ENABLE": "0"},
    "Simple only": {"NCCL_PROTO": "Simple"},
    "LL128 only": {"NCCL_PROTO": "LL128"},
}


def nccl_env(setting: str) -> dict[str, str]:
    """The environment variables of one :data:`NCCL_SETTINGS` entry."""
    if setting not in NCCL_SETTINGS:
        raise ValueError(f"unknown NCCL setting {setting!r}; choose from {list(NCCL_SETTINGS)}")
    return dict(NCCL_SETTINGS[setting])


def measure_nccl(
    settings: Sequence[str] = tuple(NCCL_SETTINGS),
    nbytes: int = 64 << 20,
    repeats: int = 20,
    timeout_s: float = 300.0,
) -> dict[str, float]:
    """On this machine's GPUs: median seconds of one ``nbytes`` all-reduce across all GPUs,
    one fresh process per setting (NCCL reads its variables when it starts).

    Raises RuntimeError without two or more GPUs: NCCL has nothing to do on one.
    """
    import jax

    if jax.devices()[0].platform != "gpu" or jax.device_count() < 2:
        raise RuntimeError("NCCL knobs need 2 or more GPUs in this process: run in GPU mode")
    out = {}
    for setting in settings:
        env = {**nccl_env(setting), "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS") or "cuda"}
        try:
            out[setting] = time_all_reduce(nbytes, repeats, env, timeout_s)[0]
        except RuntimeError as exc:
            raise RuntimeError(f"{setting}: {exc}") from None
    return out


def time_all_reduce(
    nbytes: int, repeats: int, env: Mapping[str, str] | None = None, timeout_s: float = 300.0
) -> tuple[float, int]:
    """``(median seconds, devices)`` of one ``nbytes`` bf16 all-reduce across every device of
    a fresh process whose environment adds ``env`` (:func:`_nccl_child` runs it)."""
    args = ["nccl", str(int(nbytes)), str(int(repeats))]
    run = run_with_flags([], module=__name__, args=args, env=env, timeout_s=timeout_s)
    if run.returncode != 0 or not isinstance(run.result, dict):
        raise RuntimeError(
            f"the all-reduce run failed (exit {run.returncode}):\n{run.stderr[-1500:]}"
        )
    result = cast("_NcclResult", run.result)  # what _nccl_child emits
    return float(result["median_s"]), int(result["devices"])


def _nccl_child(argv: Sequence[str]) -> int:
    """Subprocess side of :func:`time_all_reduce`: ``NBYTES REPEATS``; emits the median."""
    import jax
    import jax.numpy as jnp

    nbytes, repeats = int(argv[0]), int(argv[1])
    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("d",))
    x = jnp.ones((n, nbytes // 2 // n), jnp.bfloat16)  # (devices, elements per device)
    x = jax.device_put(x, jax.NamedSharding(mesh, jax.P("d")))
    total = jax.shard_map(
        lambda b: jax.lax.psum(b, "d"), mesh=mesh, in_specs=jax.P("d"), out_specs=jax.P("d")
    )
    timing = timeit(jax.jit(total), x, warmup=0, repeats=repeats)  # the first call apart
    emit(_NcclResult(median_s=timing.median, devices=n))
    return 0


# ---------------------------------------------------------------------------------------
# Exercise checkers


def check_profile_fix(
    answer: object,
    recorded: Mapping[str, float],
    compile_fn: Callable[[ProfileOptions], object] | None = None,
) -> Feedback:
    """06b.1: entries that, added to the recorded profile, let the ERROR compile through.

    Compiles the MLP step with the recorded profile plus ``answer`` at
    ``PGLE_STRICTNESS_LEVEL_ERROR``; ``compile_fn(options)`` replaces the compile in tests.
    """
    if unanswered(answer):
        return judge("06b.1", answer, False, "", "")
    if not isinstance(answer, dict) or not answer:
        return Feedback("06b.1", False, True, f"expected a dict {{name: cost_us}}, got {answer!r}")
    compile_fn = compile_fn or (lambda o: compile_mlp(o))
    costs = {**dict(recorded), **answer}
    options: dict[str, CompilerOption | bytes] = {
        "fdo_profile": profile_text(costs).encode(),
        PGLE_CHECKER: "PGLE_STRICTNESS_LEVEL_ERROR",
    }
    try:
        compile_fn(options)
    except Exception as exc:  # XLA's JaxRuntimeError: still missing instructions
        first = str(exc).splitlines()[0][:160]
        return Feedback(
            "06b.1",
            False,
            True,
            f"XLA still refuses it: {first}. The scheduler sees the names from *before* the "
            "async-to-sync conversion: which async start of the base program has no pair in "
            "the cheap one?",
        )
    return judge("06b.1", answer, True, "the ERROR compile goes through: no name is missing.", "")


def check_all_kernels_recorded(
    answer: object, compile_fn: Callable[[CompilerOptions, Path], str] | None = None
) -> Feedback:
    """06b.2: per-compile options under which every kernel of the MLP step is recorded in a
    command buffer. Compiles with ``answer`` and reads the thunks;
    ``compile_fn(options, folder) -> final thunk sequence`` replaces that in tests."""
    from labkit.core.env import scratch_dir
    from labkit.runtime.thunks import dump_options, parse_thunk_sequence, read_dump, summary

    if unanswered(answer):
        return judge("06b.2", answer, False, "", "")
    if not isinstance(answer, dict):
        return Feedback("06b.2", False, True, f"expected a dict of options, got {answer!r}")

    def real(options: CompilerOptions, folder: Path) -> str:
        compile_mlp({**options, **dump_options(folder)})
        return read_dump(folder).final

    folder = scratch_dir("labkit-06b-")
    try:
        final = (compile_fn or real)(dict(answer), folder)
    except Exception as exc:  # XLA's JaxRuntimeError for an unknown option or value
        return Feedback("06b.2", False, True, f"XLA rejected it: {str(exc).splitlines()[0][:160]}")
    facts = summary(parse_thunk_sequence(final))
    recorded = facts["kernels in command buffers"]
    return judge(
        "06b.2",
        answer,
        facts["kernels outside"] == 0 and facts["command buffers"] > 0,
        f"{facts['command buffers']} command buffers record all {recorded} kernels; what the "
        f"host still launches one by one: {facts['outside']}.",
        f"{facts['kernels outside']} kernels are still launched one by one: which flag sets how "
        "many commands a run needs before it becomes a graph? (labkit.xla.flags.default_of)",
    )


EXERCISE_LAYERS = 2  # 06b.3: the scanned step's layers, where section 4 compiled 4


def check_pipelined_at_two_layers(
    answer: object, compile_hlo: Callable[[], str] | None = None
) -> Feedback:
    """06b.3: how many collectives the scanned step with :data:`EXERCISE_LAYERS` layers
    pipelines at ``O1``, compiled per compile (:func:`level_per_compile`); ``compile_hlo()
    -> str`` replaces the compile in tests."""
    if unanswered(answer):
        return judge("06b.3", answer, False, "", "")
    text = compile_hlo() if compile_hlo else level_per_compile("O1", EXERCISE_LAYERS).hlo
    found = metrics(text)
    return check_integer(
        "06b.3",
        answer,
        found["pipelined"],
        f"{found['pipelined']} pipelined collective starts (of {found['async collectives']} "
        "async): the count is of ops in the program text, and it depends on the loop length.",
        f"compile it: level_per_compile('O1', layers={EXERCISE_LAYERS}), then "
        "labkit.xla.compare.metrics(result.hlo)['pipelined']",
    )


# Run as ``python -m labkit.lessons.n06b_scheduler_levers levels|nccl ARGS...``: a child
# process of start_levels or time_all_reduce.
_CHILDREN: dict[str, Callable[[Sequence[str]], int]] = {"levels": _level_child, "nccl": _nccl_child}

if __name__ == "__main__":
    sys.exit(_CHILDREN[sys.argv[1]](sys.argv[2:]))


def check_collectives_recorded(answer: object) -> Feedback:
    """06b.p1 (predict): does this jaxlib record NCCL collectives in command buffers by
    default ("yes" or "no")?"""
    kinds = str(default_of(COMMAND_BUFFER)).split(",")
    expected = "yes" if "COLLECTIVES" in kinds else "no"
    return check_choice(
        "06b.p1",
        answer,
        expected,
        YES_NO,
        f"{expected}: the next cell prints the default list.",
        f"{expected}; the next cell prints the default list",
    )
