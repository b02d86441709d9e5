"""Collective flags on the kit's GPT step: compile per flag set, sweep thresholds, diff HLO.

Flags reach XLA two ways here, neither of which can kill the calling process: per compile
(``compiler_options``, :func:`compile_step`), or through ``XLA_FLAGS`` in a fresh subprocess
(:func:`compile_with_xla_flags`) for names that only ``XLA_FLAGS`` takes. Compiles target 8
compile-only H100s (:mod:`labkit.gpu_aot`) and are cached per argument set in this process:
the same arguments always give the same program.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from labkit import hlo

Options = Mapping[str, str | bool | int]
# cuBLAS GEMMs instead of Triton ones: H100 compiles ran ~1.6x faster on 2 cores. Collectives
# and their sizes stay the same; the kernels scheduled between start and done differ.
# compile_step adds it unless fast=False.
FAST: dict[str, str | bool | int] = {"xla_gpu_enable_triton_gemm": False}
THRESHOLD_FLAGS: dict[str, tuple[str, ...]] = {
    "dp": ("xla_gpu_all_reduce_combine_threshold_bytes",),
    "fsdp": (
        "xla_gpu_all_gather_combine_threshold_bytes",
        "xla_gpu_reduce_scatter_combine_threshold_bytes",
    ),
}
SWEPT_KINDS: dict[str, tuple[str, ...]] = {
    "dp": ("all-reduce",),
    "fsdp": ("all-gather", "reduce-scatter"),
}
_COMPILED: dict[tuple[Any, ...], Any] = {}  # key -> gpu_aot.AotResult


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


@dataclasses.dataclass(frozen=True)
class FlagCompile:
    """A compile run in a subprocess under ``XLA_FLAGS``: its HLO and numbers."""

    xla_flags: str
    hlo: str
    summary: dict[str, Any]
    seconds: float


def _key(options: Options) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((str(k), v) for k, v in options.items()))


def _setup(preset: str, strategy: str, batch_size: int, scan_layers: bool, num_gpus: int) -> Any:
    key = ("setup", preset, strategy, batch_size, scan_layers, num_gpus)
    if key not in _COMPILED:
        from labkit import gpu_aot, models, train

        cfg = models.GPTConfig.preset(preset, scan_layers=scan_layers)
        mesh = gpu_aot.h100_mesh((num_gpus,), ("data",))
        _COMPILED[key] = train.train_setup(cfg, mesh, strategy, batch_size)
    return _COMPILED[key]


def compile_step(
    preset: str = "tiny",
    strategy: str = "dp",
    compiler_options: Options | None = None,
    *,
    batch_size: int = 32,
    scan_layers: bool = False,
    num_gpus: int = 8,
    fast: bool = True,
) -> Any:
    """The GPT train step compiled for ``num_gpus`` H100s with these options (an AotResult)."""
    from labkit import gpu_aot

    options = {**(FAST if fast else {}), **dict(compiler_options or {})}
    key = ("compile", preset, strategy, batch_size, scan_layers, num_gpus, _key(options))
    if key not in _COMPILED:
        step, state, batch = _setup(preset, strategy, batch_size, scan_layers, num_gpus)
        _COMPILED[key] = gpu_aot.compile_for_gpu(step, state, batch, compiler_options=options)
    return _COMPILED[key]


def gradient_sizes(preset: str = "tiny") -> dict[str, int]:
    """Bytes of each gradient of the preset's GPT (one per parameter array), by parameter path."""
    import jax
    from flax import nnx

    from labkit import models

    cfg = models.GPTConfig.preset(preset)
    abstract = nnx.eval_shape(lambda: models.GPT(cfg, rngs=nnx.Rngs(0)))
    flat = nnx.to_flat_state(nnx.state(abstract, nnx.Param))
    leaves = {"/".join(map(str, path)): jax.tree.leaves(var)[0] for path, var in flat}
    return {k: int(x.size) * x.dtype.itemsize for k, x in leaves.items()}


def default_threshold(strategy: str = "dp") -> int:
    """The installed jaxlib's default combine threshold (bytes) for the strategy's collectives."""
    from labkit.flags import installed_defaults

    return int(installed_defaults()[THRESHOLD_FLAGS[strategy][0]])


def sweep_threshold(
    thresholds: Sequence[int | None],
    preset: str = "tiny",
    strategy: str = "dp",
    *,
    base_options: Options | None = None,
    compile_fn: Callable[..., Any] | None = None,
    **kwargs: Any,
) -> list[SweepRow]:
    """Compile once per threshold (all of the strategy's combine flags set to it) and count.

    ``None`` leaves the flags unset: XLA's default, reported as its value in bytes.
    """
    if strategy not in THRESHOLD_FLAGS:
        raise ValueError(f"strategy must be one of {sorted(THRESHOLD_FLAGS)}, got {strategy!r}")
    compile_fn = compile_fn or compile_step
    rows = []
    for threshold in thresholds:
        options = dict(base_options or {})
        if threshold is not None:
            options |= dict.fromkeys(THRESHOLD_FLAGS[strategy], int(threshold))
        text = compile_fn(preset, strategy, options, **kwargs).hlo
        value = default_threshold(strategy) if threshold is None else int(threshold)
        sizes: dict[str, list[int]] = {k: [] for k in SWEPT_KINDS[strategy]}
        for c in hlo.collectives(text):
            if c.kind in sizes:
                sizes[c.kind].append(c.bytes)
        for kind, found in sizes.items():
            mean = sum(found) / len(found) if found else 0.0
            rows.append(SweepRow(
                value, kind, len(found), sum(found), mean, max(found, default=0),
                tuple(sorted(found)), threshold is None,
            ))  # fmt: skip
    return rows


def counts(rows: Sequence[SweepRow], kind: str) -> list[int]:
    """The collective counts of one kind, in the sweep's threshold order."""
    return [r.count for r in rows if r.kind == kind]


def is_pipelined(inst: hlo.Instruction) -> bool:
    """True when XLA's collective pipeliner moved this op across a loop iteration."""
    return '"is_pipelined":true' in json.dumps(inst.backend_config(), separators=(",", ":"))


def pipelined(text: str) -> list[str]:
    """Names of the async starts that carry ``"is_pipelined":true``."""
    return [
        i.name for i in hlo.instructions(text) if i.opcode.endswith("-start") and is_pipelined(i)
    ]


def schedule_table(text: str) -> list[dict[str, Any]]:
    """Every collective in program order: async or sync, bytes, and the ops run in between."""
    pairs = {p.start: p for p in hlo.async_pairs(text)}
    starts = {i.name: i for i in hlo.instructions(text) if i.opcode.endswith("-start")}
    rows = []
    for c in hlo.collectives(text):
        pair = pairs.get(c.name)
        rows.append({
            "collective": c.name, "kind": c.kind, "bytes": c.bytes, "computation": c.computation,
            "in_loop": c.called_by == "while", "mode": "async" if pair else "sync",
            "ops_between": len(pair.ops_between) if pair else 0,
            "compute_between": pair.compute_between if pair else 0,
            "pipelined": c.name in starts and is_pipelined(starts[c.name]),
        })  # fmt: skip
    return rows


_P2P = ("send", "recv", "send-done", "recv-done")


def metrics(text: str) -> dict[str, int]:
    """Flat numbers of one compiled program: counts and bytes per kind, async, overlap."""
    colls = hlo.collectives(text)
    every = hlo.async_pairs(text)
    pairs = [p for p in every if p.is_collective]  # not async fusions, copies or send/recv
    ops = Counter(i.opcode for i in hlo.instructions(text))
    out: dict[str, int] = {}
    for c in colls:
        out[f"{c.kind} count"] = out.get(f"{c.kind} count", 0) + 1
        out[f"{c.kind} bytes"] = out.get(f"{c.kind} bytes", 0) + c.bytes
    out["async collectives"] = len(pairs)
    out["sync collectives"] = sum(not c.is_async for c in colls)
    out["overlapped pairs"] = sum(p.overlapped for p in pairs)
    out["compute ops between start/done"] = sum(p.compute_between for p in pairs)
    out["pipelined"] = len(pipelined(text))
    out["collectives in loops"] = sum(c.called_by == "while" for c in colls)
    out["send/recv ops"] = sum(ops[k] for k in _P2P)
    out["send/recv pairs overlapped"] = sum(p.overlapped for p in every if p.kind in _P2P)
    out["instructions"] = sum(ops.values())
    return out


def diff(hlo_a: str, hlo_b: str) -> dict[str, tuple[int, int]]:
    """What changed between two compiled programs: ``{metric: (a, b)}`` for every metric."""
    a, b = metrics(hlo_a), metrics(hlo_b)
    return {k: (a.get(k, 0), b.get(k, 0)) for k in dict.fromkeys([*a, *b])}


def changed(d: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """Only the metrics of a :func:`diff` whose two values differ."""
    return {k: v for k, v in d.items() if v[0] != v[1]}


def identical(hlo_a: str, hlo_b: str) -> bool:
    """True when two compiled programs are the same once metadata and file tables go."""

    def norm(text: str) -> list[str]:
        lines = hlo.strip_tables(hlo.strip_metadata(text)).splitlines()
        return [line.rstrip() for line in lines if line.strip()]

    return norm(hlo_a) == norm(hlo_b)


def diff_rows(d: Mapping[str, tuple[int, int]], only_changed: bool = True) -> list[dict[str, Any]]:
    """:func:`diff` as table rows ``{"metric", "before", "after"}``."""
    items = changed(d) if only_changed else d
    return [{"metric": k, "before": a, "after": b} for k, (a, b) in items.items()]


# ---------------------------------------------------------------------------------------
# XLA_FLAGS in a subprocess


def compile_with_xla_flags(
    flags: str | Sequence[str],
    preset: str = "tiny",
    strategy: str = "dp",
    *,
    scan_layers: bool = False,
    batch_size: int = 32,
    compiler_options: Options | None = None,
    timeout_s: float = 600.0,
) -> FlagCompile:
    """:func:`compile_step` in a fresh process whose XLA_FLAGS are ``flags``.

    Flags are validated first (:func:`labkit.flags.run_with_flags`): a bad one raises
    ``FlagError`` and nothing starts. This process's XLA_FLAGS never change.
    """
    from labkit.flags import run_with_flags

    spec = {
        "preset": preset, "strategy": strategy, "scan_layers": scan_layers,
        "batch_size": batch_size, "compiler_options": dict(compiler_options or {}),
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="labkit-collectives-") as tmp:
        out = Path(tmp) / "step.hlo.txt"
        run = run_with_flags(
            flags,
            module="labkit.collectives",
            args=[json.dumps(spec), str(out)],
            timeout_s=timeout_s,
        )
        if run.returncode != 0 or run.result is None or not out.exists():
            raise RuntimeError(
                f"the compile under XLA_FLAGS={run.xla_flags!r} failed (exit {run.returncode}):\n"
                f"{run.stderr[-2000:]}"
            )
        text = out.read_text()
    return FlagCompile(run.xla_flags, text, run.result, run.seconds)


def _child(argv: Sequence[str]) -> int:
    """Subprocess side of :func:`compile_with_xla_flags`: compile, write HLO, emit summary."""
    from labkit import env
    from labkit.flags import emit

    spec, out = json.loads(argv[0]), Path(argv[1])
    env.setup(cpu_devices=8, mode="cpu")  # deviceless H100 compiles need no GPU
    result = compile_step(
        spec["preset"], spec["strategy"], spec["compiler_options"],
        batch_size=spec["batch_size"], scan_layers=spec["scan_layers"],
    )  # fmt: skip
    out.write_text(result.hlo)
    emit({**hlo.summary(result.hlo), "pipelined": len(pipelined(result.hlo))})
    return 0


# ---------------------------------------------------------------------------------------
# A collective-permute in a loop, and real steps on this machine's devices


def compile_shift_loop(
    compiler_options: Options | None = None, rows: int = 256, steps: int = 4, num_gpus: int = 8
) -> Any:
    """A loop that passes a ``(rows, 256)`` f32 block to the next GPU each step, compiled.

    The shape of pipeline parallelism: GPU i sends to i + 1 (no wrap-around) while it
    computes on data it already has. Returns the AotResult for ``num_gpus`` H100s.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from labkit import gpu_aot

    mesh = gpu_aot.h100_mesh((num_gpus,), ("data",))
    shift = [(i, i + 1) for i in range(num_gpus - 1)]

    def body(x: jax.Array, w: jax.Array) -> jax.Array:
        def one(carry: tuple[jax.Array, jax.Array], _: None) -> tuple[Any, None]:
            x, acc = carry  # (rows, 256) each
            sent = jax.lax.ppermute(x, "data", shift)  # to the next GPU
            return (sent, acc + jnp.tanh(acc @ w)), None  # compute that needs no transfer

        (x, acc), _ = jax.lax.scan(one, (x, x), None, length=steps)
        return x + acc  # (rows, 256)

    fn = jax.shard_map(body, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"))
    x = jax.ShapeDtypeStruct(
        (num_gpus * rows, 256), jnp.float32, sharding=NamedSharding(mesh, P("data"))
    )
    w = jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=NamedSharding(mesh, P()))
    return gpu_aot.compile_for_gpu(fn, x, w, compiler_options=dict(compiler_options or {}))


def local_step(
    preset: str = "tiny",
    strategy: str = "dp",
    batch_size: int = 32,
    compiler_options: Options | None = None,
    devices: Sequence[Any] | None = None,
) -> tuple[Any, Any, Any]:
    """``(compiled, state, batch)``: the step on real ``devices`` (default: all), ready to run."""
    import jax
    import numpy as np
    from jax.sharding import AxisType, Mesh

    from labkit import data, models, train

    devices = list(devices if devices is not None else jax.devices())
    mesh = Mesh(np.array(devices), ("data",), axis_types=(AxisType.Auto,))
    cfg = models.GPTConfig.preset(preset)
    step, abstract, batch_abs = train.train_setup(cfg, mesh, strategy, batch_size)
    state = train.init_train_state(cfg, abstract)
    tokens = data.batch_at(data.encode(data.corpus(200_000)), 0, batch_size, cfg.seq_len)
    batch = jax.device_put(tokens, batch_abs.sharding)  # (batch, seq_len + 1) int32
    options = dict(compiler_options or {})
    return step.lower(abstract, batch_abs).compile(compiler_options=options), state, batch


def time_steps(compiled: Any, state: Any, batch: Any, repeats: int = 10, warmup: int = 2) -> Any:
    """Time ``repeats`` real steps with :func:`labkit.bench.timeit`, carrying the donated state."""
    import jax

    from labkit import bench

    box = {"state": jax.tree.map(lambda x: x.copy(), state)}  # the step donates its state

    def one() -> Any:
        box["state"], loss = compiled(box["state"], batch)
        return loss

    return bench.timeit(one, warmup=warmup, repeats=repeats)


def timing_rows(times: Mapping[str, Any], baseline: str = "default") -> list[dict[str, Any]]:
    """Rows ``{"flags", "median ms", "spread", "vs baseline"}`` from ``{name: bench.Timing}``."""
    base = times[baseline].median
    return [
        {
            "flags": name,
            "median ms": round(t.median * 1e3, 3),
            "spread": f"{t.spread:.0%}",
            "vs baseline": f"{t.median / base:.2f}x",
        }
        for name, t in times.items()
    ]


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
