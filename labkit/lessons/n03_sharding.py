"""03_sharding: partitioner switches, matmul plans, collective matmul, GPT accounting, checkers.

The notebook's own code. Byte formulas and layouts live in :mod:`labkit.parallel.sharding`
(they know no model); this module applies them to matmuls and to the kit's GPT.
:func:`matmul_explorer` is a thin widget over :meth:`ShardedMatmul.plan`, a plain tested method.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from labkit.core.feedback import (
    Feedback,
    check_choice,
    check_number,
    judge,
    unanswered,
)
from labkit.core.figures import Grid, Picture, layout_grids
from labkit.core.report import markdown_table, table
from labkit.core.types import CompilerOptions, PyTree
from labkit.core.widgets import show_html, show_text
from labkit.gpt.config import GPTConfig
from labkit.parallel.sharding import (
    Params,
    Strategy,
    gradient_sync_bytes,
    layout_grid,
    layout_text,
    ring_bytes,
    strategy_mesh,
)
from labkit.xla import hlo
from labkit.xla.cost import kernel_flops
from labkit.xla.hlo_text import Instruction, entry_computation, parse_module
from labkit.xla.pass_trace import PassTrace, traced
from labkit.xla.predict import trip_multipliers

if TYPE_CHECKING:  # for annotations: jax and ipywidgets are imported by the functions using them
    import jax
    from ipywidgets import VBox
    from jax.sharding import PartitionSpec

    from labkit.gpt.train import State
    from labkit.xla.aot import AotResult

MATMUL_SHAPE = (256, 512, 256)  # (m, k, n): x is (m, k), w is (k, n)


# ---------------------------------------------------------------------------------------
# Shardy or GSPMD


@contextlib.contextmanager
def partitioner(name: str) -> Iterator[None]:
    """Lower and compile with ``"shardy"`` or ``"gspmd"`` inside; the setting is restored after."""
    import jax

    if name not in ("shardy", "gspmd"):
        raise ValueError(f"partitioner must be 'shardy' or 'gspmd', got {name!r}")
    old = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", name == "shardy")
    try:
        yield
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)


def which_partitioner(lowered_text: str) -> str:
    """``"shardy"`` (``sdy.sharding``), ``"gspmd"`` (``mhlo.sharding``) or ``"none"``, from text."""
    if "sdy.sharding" in lowered_text or "sdy.mesh" in lowered_text:
        return "shardy"
    return "gspmd" if "mhlo.sharding" in lowered_text else "none"


_ANNOTATION = (
    r"(sdy\.mesh @\w+ = <[^>]*>|sdy\.sharding(?:_constraint)?[ =<][^>]*>"
    r"|mhlo\.sharding = \"[^\"]*\")"
)


def sharding_lines(lowered_text: str, width: int = 110) -> list[str]:
    """The annotations of a lowered module: each ``sdy``/``mhlo.sharding`` attribute, one a line."""
    found = re.findall(_ANNOTATION, lowered_text)
    return [f[:width] for f in found]


# ---------------------------------------------------------------------------------------
# Which passes partition: XLA's pass dumps


def pass_trace(fn: Callable[..., object], *args: PyTree, module: str | None = None) -> PassTrace:
    """The passes that changed ``jax.jit(fn)``'s module (``jit_<fn name>``) compiled for
    ``args`` (abstract arrays with shardings), in order: see :class:`PassTrace`."""
    import jax

    def compile_with(options: dict[str, str]) -> jax.stages.Compiled:
        return jax.jit(fn).lower(*args).compile(compiler_options=options)

    return traced(compile_with, module or f"jit_{fn.__name__}")[1]


def entry_parameters(hlo_text: str) -> list[str]:
    """The ENTRY computation's parameter shapes without layouts, e.g. ``['f32[256,512]']``."""
    params = [i for i in entry_computation(hlo_text) if i.opcode == "parameter"]
    return [re.sub(r"\{[^}]*\}", "", i.shape) for i in params]


# ---------------------------------------------------------------------------------------
# Collectives of compiled programs


class CollectiveRow(TypedDict):
    """One collective of a compiled program, as :func:`collective_rows` lists it."""

    kind: str
    bytes: int  # the full buffer
    group: int | None  # devices in each replica group (None: XLA did not say)
    sent_per_device: int  # by the ring formulas of :func:`labkit.parallel.sharding.ring_bytes`


def collective_rows(hlo_text: str) -> list[CollectiveRow]:
    """One row per collective: kind, full-buffer bytes, group size, ring bytes sent per device."""
    return [
        {
            "kind": c.kind,
            "bytes": c.bytes,
            "group": c.group_size,
            "sent_per_device": round(ring_bytes(c.kind, c.bytes, c.group_size or 1)),
        }
        for c in hlo.collectives(hlo_text)
    ]


type SpecLike = PartitionSpec | tuple[str | tuple[str, ...] | None, ...]
"""A layout: a ``PartitionSpec``, or the tuple of its entries (``("x", None)``)."""


def _spec(entries: SpecLike) -> PartitionSpec:
    from jax.sharding import PartitionSpec

    return entries if isinstance(entries, PartitionSpec) else PartitionSpec(*entries)


COLLECTIVE_COLUMNS = ["kind", "bytes", "group", "sent_per_device"]


@dataclasses.dataclass(frozen=True)
class MatmulPlan:
    """What the partitioner made of one sharded matmul: layouts and collectives."""

    mesh_shape: dict[str, int]
    specs: tuple[PartitionSpec, PartitionSpec, PartitionSpec]  # x, w, out
    layouts: dict[str, str]
    collectives: list[CollectiveRow]
    grids: Mapping[str, Grid]  # x, w, out: the devices holding each block
    shape: tuple[int, int, int] = MATMUL_SHAPE

    @property
    def sent_per_device(self) -> int:
        """Bytes each device sends, by the ring formulas, summed over the collectives."""
        return sum(r["sent_per_device"] for r in self.collectives)

    def text(self) -> str:
        """The layouts side by side with the collectives table."""
        pairs = zip(self.layouts.items(), self.specs, strict=True)
        parts = [f"{name} {spec}:\n{grid}" for (name, grid), spec in pairs]
        table = markdown_table(self.collectives, COLLECTIVE_COLUMNS)
        return "\n".join(parts) + "\n" + (table if self.collectives else "no collectives")

    def picture(self) -> Picture:
        """The three layouts as coloured device grids, side by side."""
        m, k, n = self.shape
        shapes = {"x": (m, k), "w": (k, n), "out": (m, n)}
        panels = {
            f"{name} {shapes[name]} {tuple(spec)}": self.grids[name]
            for name, spec in zip(("x", "w", "out"), self.specs, strict=True)
        }
        mesh = " x ".join(f"{a} {s}" for a, s in self.mesh_shape.items())
        kinds = ", ".join(r["kind"] for r in self.collectives) or "no collective"
        return layout_grids(
            panels,
            f"x @ w on a mesh of {mesh}: {kinds}",
            note=f"Mesh {self.mesh_shape}; each device sends {self.sent_per_device} bytes.",
        )

    def html(self) -> str:
        """The picture and the collectives table, rendered (what the explorer shows)."""
        rows = table(self.collectives, COLLECTIVE_COLUMNS, caption="collectives")
        below = rows._repr_html_() if self.collectives else "<p>no collectives</p>"
        return self.picture()._repr_html_() + below


@dataclasses.dataclass(frozen=True)
class ShardedMatmul:
    """``x (m, k) @ w (k, n)`` in f32 with its inputs laid out by specs on a mesh, for
    ``target`` "cpu" or "h100" (8 H100s, deviceless); ``shape`` is ``(m, k, n)``.

    A spec is a ``PartitionSpec`` or a tuple of axis names (``("x", None)``); ``out_spec``
    None lets the partitioner choose the output layout.
    """

    mesh_shape: Mapping[str, int]
    x_spec: SpecLike
    w_spec: SpecLike
    out_spec: SpecLike | None = None
    target: str = "cpu"
    shape: tuple[int, int, int] = MATMUL_SHAPE

    def __post_init__(self) -> None:
        if self.target not in ("cpu", "h100"):
            raise ValueError(f"target must be 'cpu' or 'h100', got {self.target!r}")

    def compile(self, compiler_options: CompilerOptions | None = None) -> jax.stages.Compiled:
        """The compiled executable (``compiler_options``: XLA options for this compile)."""
        import jax
        import jax.numpy as jnp
        from jax.sharding import NamedSharding

        from labkit.core.mesh import abstract, make_mesh
        from labkit.xla import aot

        names, sizes = tuple(self.mesh_shape), tuple(self.mesh_shape.values())
        if self.target == "cpu":
            mesh = make_mesh(sizes, names, devices=jax.devices("cpu")[: math.prod(sizes)])
        else:
            mesh = aot.h100_mesh(sizes, names)
        m, k, n = self.shape
        x = abstract(jax.ShapeDtypeStruct((m, k), jnp.float32), mesh, _spec(self.x_spec))
        w = abstract(jax.ShapeDtypeStruct((k, n), jnp.float32), mesh, _spec(self.w_spec))
        out = None if self.out_spec is None else NamedSharding(mesh, _spec(self.out_spec))
        jitted = jax.jit(jnp.matmul) if out is None else jax.jit(jnp.matmul, out_shardings=out)
        return jitted.lower(x, w).compile(compiler_options=dict(compiler_options or {}))

    def hlo(self) -> str:
        """The compiled program's HLO text."""
        return str(self.compile().as_text())

    def pass_trace(self) -> PassTrace:
        """:func:`pass_trace` of this compile: the passes that changed it, in order."""
        return traced(self.compile, "jit_matmul")[1]

    def plan(self) -> MatmulPlan:
        """What the partitioner made of it: layouts (the output's as chosen), collectives."""
        compiled = self.compile()
        m, k, n = self.shape
        out_spec = self.out_spec
        if out_spec is None:  # the layout the partitioner chose, read from the same executable
            out_spec = compiled.output_shardings.spec
        specs = (_spec(self.x_spec), _spec(self.w_spec), _spec(out_spec))
        mesh_shape = dict(self.mesh_shape)
        grids = {
            name: layout_grid(s, spec, mesh_shape)
            for name, s, spec in (
                ("x", (m, k), specs[0]),
                ("w", (k, n), specs[1]),
                ("out", (m, n), specs[2]),
            )
        }
        layouts = {name: layout_text(grid) for name, grid in grids.items()}
        collectives = collective_rows(str(compiled.as_text()))
        return MatmulPlan(mesh_shape, specs, layouts, collectives, grids, self.shape)


MESH_CHOICES = {"8": {"x": 8}, "4x2": {"x": 4, "y": 2}, "2x4": {"x": 2, "y": 4}}
SPEC_CHOICES = ["None, None", "x, None", "None, x", "y, None", "None, y", "x, y", "y, x"]


def _parse_spec(text: str) -> tuple[str | None, ...]:
    return tuple(None if p.strip() == "None" else p.strip() for p in text.split(","))


def matmul_explorer() -> VBox:
    """A widget: pick a mesh and specs for ``x @ w``; see layouts, collectives and bytes."""
    import ipywidgets as w

    mesh = w.Dropdown(options=list(MESH_CHOICES), value="8", description="mesh")
    x = w.Dropdown(options=SPEC_CHOICES, value="x, None", description="x spec")
    wt = w.Dropdown(options=SPEC_CHOICES, value="None, None", description="w spec")
    target = w.Dropdown(options=["cpu", "h100"], value="cpu", description="compile for")
    out = w.Output()

    def show(_: object = None) -> None:  # no `with out:` capture: it can hang papermill
        try:
            plan = ShardedMatmul(
                MESH_CHOICES[mesh.value],
                _parse_spec(x.value),
                _parse_spec(wt.value),
                target=target.value,
            ).plan()
        except ValueError as err:  # a spec naming an axis the mesh lacks, or not dividing
            show_text(out, f"not a valid layout: {err}")
            return
        sent = f"bytes sent per device: {plan.sent_per_device}"
        show_html(out, f"{plan.html()}<p>{sent}</p>", f"{plan.text()}\n\n{sent}")

    for widget in (mesh, x, wt, target):
        widget.observe(show, names="value")
    show()
    return w.VBox([w.HBox([mesh, target]), w.HBox([x, wt]), out])


# ---------------------------------------------------------------------------------------
# shard_map: a collective matmul


def allgather_matmul(x: jax.Array, w: jax.Array, axis: str = "x") -> jax.Array:
    """Per device: gather all rows of ``x``, then multiply by the local columns of ``w``."""
    import jax

    return jax.lax.all_gather(x, axis, tiled=True) @ w  # (rows, cols / n)


def collective_matmul(x: jax.Array, w: jax.Array, axis: str = "x") -> jax.Array:
    """The same product, with the all-gather split into n - 1 ``ppermute`` steps.

    Each step multiplies the row block it holds while passing it on to the previous
    device, so a transfer can overlap the matmul of the block already there.
    """
    import jax
    import jax.numpy as jnp

    n, me, rows = jax.lax.axis_size(axis), jax.lax.axis_index(axis), x.shape[0]
    perm = [(i, (i - 1) % n) for i in range(n)]  # device i sends to i - 1
    out = jax.lax.pcast(jnp.zeros((rows * n, w.shape[1]), x.dtype), axis, to="varying")

    def step(
        carry: tuple[jax.Array, jax.Array], i: jax.Array
    ) -> tuple[tuple[jax.Array, jax.Array], None]:
        block, out = carry  # (rows / n, k): the block that started on device me + i
        nxt = jax.lax.ppermute(block, axis, perm)  # in flight while the matmul runs
        out = jax.lax.dynamic_update_slice_in_dim(out, block @ w, ((me + i) % n) * rows, 0)
        return (nxt, out), None

    (block, out), _ = jax.lax.scan(step, (x, out), jnp.arange(n - 1))
    return jax.lax.dynamic_update_slice_in_dim(out, block @ w, ((me + n - 1) % n) * rows, 0)


def compile_matmul_h100(
    fn: Callable[[jax.Array, jax.Array], jax.Array], m: int = 2048, k: int = 4096, n: int = 4096
) -> AotResult:
    """``fn`` under ``shard_map`` on 8 H100s, bf16 ``x (m, k)`` rows and ``w (k, n)`` columns
    (XLA's default program: :func:`labkit.gpt.compile.same_program_options` only make the
    compile cheaper)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from labkit.gpt.compile import same_program_options
    from labkit.xla import aot

    mesh = aot.h100_mesh((8,), ("x",))
    mapped = jax.shard_map(
        fn, mesh=mesh, in_specs=(P("x", None), P(None, "x")), out_specs=P(None, "x")
    )
    x = aot.abstract(jax.ShapeDtypeStruct((m, k), jnp.bfloat16), mesh, P("x", None))
    w = aot.abstract(jax.ShapeDtypeStruct((k, n), jnp.bfloat16), mesh, P(None, "x"))
    return aot.compile_for_gpu(mapped, x, w, compiler_options=same_program_options())


def window_rows(
    hlo_text: str, start: str, gpu: str = "H100 SXM"
) -> list[dict[str, str | bool | float]]:
    """The kernels scheduled between async collective ``start`` and its done, each with
    :func:`labkit.xla.overlap.kernel_cost`'s estimate: ``matmul`` (it has matrix-product
    FLOPs), ``dynamic update`` (a fusion around a dynamic-update-slice), the HBM bytes the
    model charges it (MB) and its time (us). Their times add up to the estimate's
    ``compute_us`` for that collective (:func:`labkit.xla.compare.schedule_table`)."""
    from labkit.core.hardware import hardware
    from labkit.xla import overlap

    module = parse_module(hlo_text)
    pair = next(p for p in hlo.async_pairs(hlo_text) if p.start == start)
    by_name = {i.name: i for i in hlo.instructions(hlo_text)}
    hw = hardware(gpu)
    rows: list[dict[str, str | bool | float]] = []
    for name in pair.ops_between:
        inst = by_name[name]
        cost = overlap.kernel_cost(module, inst, hw)
        if not cost.kernels:
            continue  # tuple reads, bitcasts: no kernel
        fused = [c for callee in inst.callees("calls") for c in module.computations.get(callee, ())]
        rows.append(
            {
                "kernel": name,
                "output": re.sub(r"\{[^}]*\}", "", inst.shape),
                "matmul": cost.matmuls > 0,
                "dynamic update": any(c.opcode == "dynamic-update-slice" for c in fused),
                "HBM MB": round(cost.hbm_bytes / 1e6, 2),
                "us": round(cost.seconds * 1e6, 3),
            }
        )
    return rows


# ---------------------------------------------------------------------------------------
# The GPT: parameters by logical names, activation traffic, strategies


def gpt_params(cfg: GPTConfig | str = "tiny") -> Params:
    """The GPT's params as ``{path: (logical names, shape, itemsize)}`` for the sharding rules."""
    from flax import nnx

    from labkit.gpt.model import GPT

    cfg = GPTConfig.of(cfg)
    model = nnx.eval_shape(lambda: GPT(cfg, rngs=nnx.Rngs(0)))
    out = {}
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        names = var.get_metadata().get("out_sharding") or (None,) * len(var.shape)
        out["/".join(map(str, path))] = (tuple(names), tuple(var.shape), var.dtype.itemsize)
    return out


def tp_activation_bytes(
    cfg: GPTConfig | str, batch_size: int, axis_sizes: Mapping[str, int]
) -> float:
    """Bytes each device sends per step for Megatron tensor parallelism's activations.

    Per layer, 2 all-reduces forward (after attention and after the MLP) and 2 backward
    (their inputs' gradients), each on this data shard's ``(batch, seq, d_model)``
    activations, over the ``"model"`` axis.
    """
    import jax.numpy as jnp

    cfg = GPTConfig.of(cfg)
    n_model, n_data = axis_sizes.get("model", 1), axis_sizes.get("data", 1)
    itemsize = jnp.dtype(cfg.dtype).itemsize  # GPTConfig holds a dtype; its field is DTypeLike
    size = batch_size // n_data * cfg.seq_len * cfg.d_model * itemsize
    return 4 * cfg.num_layers * ring_bytes("all-reduce", size, n_model)


def local_step(
    strategy: Strategy,
    cfg: GPTConfig | str = "tiny",
    batch_size: int = 32,
    devices: Sequence[jax.Device] | None = None,
) -> tuple[jax.stages.Compiled, State, jax.Array]:
    """``(compiled, state, batch)`` for the strategy on real ``devices`` (default: all).

    The state is :func:`labkit.gpt.train.timing_state`'s, not a trained model: for timing only.
    """
    import jax

    from labkit.gpt import train
    from labkit.gpt.compile import local_train_step

    mesh = strategy_mesh(strategy, list(devices if devices is not None else jax.devices()))
    return local_train_step(cfg, strategy, batch_size, mesh=mesh, make_state=train.timing_state)


# ---------------------------------------------------------------------------------------
# The compiled steps: memory, and where the schedule puts the collectives


def memory_rows(
    steps: Mapping[str, AotResult], state_bytes: Mapping[str, float]
) -> list[dict[str, str | float | None]]:
    """Per strategy: the kit's parameter + Adam state per device next to what the compiler
    assigns per device (:func:`labkit.xla.memory.memory` of each compiled step), in MB."""
    from labkit.xla.memory import memory

    rows = []
    for s, result in steps.items():
        row = memory(result.compiled).row(s)
        kit = {"kit: params + Adam MB": round(state_bytes[s] / 1e6, 2)}
        rows.append({"program": row.pop("program"), **kit, **row})
    return rows


def _pass(inst: Instruction) -> str:
    """``backward`` for an op JAX traced under ``transpose(jvp())`` (its metadata), else
    ``forward``."""
    return "backward" if "transpose(" in (inst.attr("metadata") or "") else "forward"


def collective_runs(hlo_text: str) -> list[dict[str, str | int]]:
    """Each collective with how often one step runs it: in a ``while`` body (a ``scan``),
    ``runs`` is its loop's trip count (nested loops multiply; 1 outside loops)."""
    module = parse_module(hlo_text)
    by_name = {i.name: i for i in hlo.instructions(hlo_text)}
    for inst in by_name.values():
        if inst.opcode == "while" and inst.trip_count is None:
            raise ValueError(f"{inst.name}: XLA knows no trip count, so its runs are unknown")
    times = trip_multipliers(module)
    return [
        {
            "collective": c.name,
            "kind": c.kind,
            "pass": _pass(by_name[c.name]),
            "bytes": c.bytes,
            "runs": times.get(c.computation, 1),
        }
        for c in hlo.collectives(hlo_text)
    ]


def mlp_layers(params: tuple[jax.Array, jax.Array], x: jax.Array) -> jax.Array:
    """``x + relu(x @ w1) @ w2`` for each layer of the stacked ``(w1, w2)``, run by
    ``jax.lax.scan``: one loop body for all layers, as ``GPTConfig(scan_layers=True)`` runs
    the GPT's blocks."""
    import jax

    def layer(h: jax.Array, w: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
        return h + jax.nn.relu(h @ w[0]) @ w[1], None

    return jax.lax.scan(layer, x, params)[0]


def scanned_fsdp_mlp(
    layers: int = 4, d_model: int = 128, d_ff: int = 512, batch_size: int = 32
) -> AotResult:
    """An SGD step of :func:`mlp_layers` under FSDP, compiled for 8 H100s (an ``AotResult``).

    ``w1 (layers, d_model, d_ff)`` and ``w2 (layers, d_ff, d_model)`` are split over
    ``"data"`` on ``d_model``, the batch ``(batch_size, d_model)`` too, and the updated
    weights keep that layout. XLA's default program, with the options that leave it byte for
    byte the same (:func:`labkit.gpt.compile.same_program_options`).
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from labkit.gpt.compile import same_program_options
    from labkit.xla import aot

    mesh = aot.h100_mesh((8,), ("data",))
    w1 = jax.ShapeDtypeStruct((layers, d_model, d_ff), jnp.float32)
    w2 = jax.ShapeDtypeStruct((layers, d_ff, d_model), jnp.float32)
    params = (
        aot.abstract(w1, mesh, P(None, "data", None)),
        aot.abstract(w2, mesh, P(None, None, "data")),
    )
    x = aot.abstract(jax.ShapeDtypeStruct((batch_size, d_model), jnp.float32), mesh, P("data"))

    def step(
        params: tuple[jax.Array, jax.Array], x: jax.Array
    ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
        loss, grads = jax.value_and_grad(lambda p: jnp.mean(mlp_layers(p, x) ** 2))(params)
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), loss

    layout = tuple(p.sharding for p in params)
    jitted = jax.jit(step, donate_argnums=0, out_shardings=(layout, None))
    return aot.compile_for_gpu(jitted, params, x, compiler_options=same_program_options())


def kernels_before(hlo_text: str, name: str) -> dict[str, int]:
    """Compute kernels scheduled before collective ``name`` in its computation: how many, and
    how many of them it needs (they produce its operands, directly or not)."""
    module = parse_module(hlo_text)
    comp = next(c for c, insts in module.computations.items() if any(i.name == name for i in insts))
    insts = module.computations[comp]
    position = next(k for k, i in enumerate(insts) if i.name == name)
    by_name = {i.name: i for i in insts}
    needed, todo = set(), [name]
    while todo:
        for operand in by_name[todo.pop()].operands:
            if operand in by_name and operand not in needed:
                needed.add(operand)
                todo.append(operand)
    before = [i for i in insts[:position] if hlo.is_compute(module, i)]
    return {
        "before": len(before),
        "needed": sum(i.name in needed for i in before),
        "kernels": sum(hlo.is_compute(module, i) for i in insts),
    }


def beside_rows(hlo_text: str, kind: str = "all-reduce") -> list[dict[str, str | int | None]]:
    """Each ``kind`` collective in schedule order, and what the scheduler could have run beside it.

    ``pass``: forward, or backward (JAX's ``transpose(jvp())`` in the op's metadata);
    ``between``: kernels scheduled between its start and done (0 when synchronous);
    ``independent``: kernels that neither feed it nor use its result
    (:func:`labkit.xla.hlo.independent_kernels`), ``gemms`` of them with matrix-product
    FLOPs, and ``in_other_windows`` of them scheduled between another collective's start and
    done instead.
    """
    module = parse_module(hlo_text)
    order = {i.name: k for k, i in enumerate(hlo.instructions(hlo_text))}
    by_name = {i.name: i for i in hlo.instructions(hlo_text)}
    pairs = {p.start: p for p in hlo.async_pairs(hlo_text) if p.is_collective and not p.is_sync}
    windows = {s: (order[s], order[p.done]) for s, p in pairs.items()}
    rows = []
    for c in hlo.collectives(hlo_text):
        if c.kind != kind:
            continue
        free = hlo.independent_kernels(hlo_text, c.name)
        elsewhere = [
            k for k in free if any(a < order[k] < b for s, (a, b) in windows.items() if s != c.name)
        ]
        rows.append(
            {
                "collective": c.name,
                "pass": _pass(by_name[c.name]),
                "group": c.group_size,
                "bytes": c.bytes,
                "mode": "async" if c.name in pairs else "sync",
                "between": pairs[c.name].compute_between if c.name in pairs else 0,
                "independent": len(free),
                "gemms": sum(sum(kernel_flops(module, by_name[k]).values()) > 0 for k in free),
                "in_other_windows": len(elsewhere),
            }
        )
    return rows


def most_in_flight(hlo_text: str, kind: str = "all-reduce") -> int:
    """The most ``kind`` collectives in flight at once: 1 + the other starts of that kind
    scheduled inside one asynchronous start/done window, at most over the windows (0: none
    is asynchronous)."""
    pairs = [
        p for p in hlo.async_pairs(hlo_text) if p.is_collective and not p.is_sync and p.kind == kind
    ]
    starts = {p.start for p in pairs}
    return max((1 + sum(op in starts for op in p.ops_between) for p in pairs), default=0)


# ---------------------------------------------------------------------------------------
# Automatic sharding: what this jax/jaxlib has


def auto_sharding_evidence() -> dict[str, bool | list[str]]:
    """Checks for automatic sharding in the installed jax and jaxlib."""
    import jax
    from jax._src import sharding_impls
    from jax._src.lib import _jax

    build = _jax.CompileOptions().executable_build_options
    root = Path(jax.__file__).parent
    users = sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "use_auto_spmd_partitioning" in p.read_text(errors="ignore")
    )
    return {
        "jax.sharding.AUTO": hasattr(jax.sharding, "AUTO"),
        "jax._src.sharding_impls.AUTO": hasattr(sharding_impls, "AUTO"),
        "jaxlib build option use_auto_spmd_partitioning": hasattr(
            build, "use_auto_spmd_partitioning"
        ),
        "jax files that set it": users,
    }


# ---------------------------------------------------------------------------------------
# Checkers


def check_scatter_on_h100(answer: Any) -> Feedback:
    """03.1: ``(x_spec, w_spec, out_spec)`` for ``x @ w`` on the ``{"data": 4, "model": 2}``
    mesh whose H100 program runs exactly one reduce-scatter and whose CPU program runs
    exactly one all-reduce instead (both compiled)."""
    ex = "03.1"
    if unanswered(answer):
        return judge(ex, answer, False, "", "")
    mesh = {"data": 4, "model": 2}
    try:
        x_spec, w_spec, out_spec = answer
        found = {
            target: hlo.collective_counts(
                ShardedMatmul(mesh, x_spec, w_spec, out_spec, target).hlo()
            )
            for target in ("cpu", "h100")
        }
    except (TypeError, ValueError) as err:
        return judge(
            ex,
            answer,
            False,
            "",
            f"give three specs like (('data', None), (None, None), None): {err}",
        )
    return judge(
        ex,
        answer,
        found == {"cpu": {"all-reduce": 1}, "h100": {"reduce-scatter": 1}},
        "partial sums over model, wanted split over model: the GPU compiler reduce-scatters.",
        f"that compiles to {found['cpu'] or 'nothing'} on the CPU and {found['h100'] or 'nothing'} "
        "on the H100s",
    )


def check_ring_bytes(answer: object) -> Feedback:
    """03.2: bytes each of 8 GPUs sends to all-reduce a 4 MiB gradient with a ring."""
    expected = ring_bytes("all-reduce", 4 * 2**20, 8)
    hint = (
        "a ring all-reduce is a reduce-scatter then an all-gather: 2(n-1)/n of the buffer "
        "(4 MiB is 4 * 2**20 bytes; the exact count or 3 significant figures, e.g. 1.23e6)"
    )
    return check_number("03.2", answer, expected, 1e-3, hint)  # 7.34e6: the right formula


TP_DEGREE_EXERCISE = {"data": 2, "model": 4}  # 03.3's mesh: 4-way tensor parallelism


def check_tp_activation_bytes(
    answer: object, cfg: GPTConfig | str = "tiny", batch_size: int = 32
) -> Feedback:
    """03.3: bytes each device sends per step for Megatron TP's activation all-reduces on
    the :data:`TP_DEGREE_EXERCISE` mesh (:func:`tp_activation_bytes`, which the lesson checks
    against the compiled program at degree 2)."""
    expected = tp_activation_bytes(cfg, batch_size, TP_DEGREE_EXERCISE)
    hint = (
        "per layer, how many activation all-reduces (forward and backward), each on which "
        "array, over how many devices? Then the ring formula for one all-reduce"
    )
    return check_number("03.3", answer, expected, 1e-3, hint)


# The three layouts of x (256, 512) @ w (512, 256) on 8 devices that section 3 compiles:
# (x spec, w spec, output spec or None for the partitioner's choice).
MATMUL_CASES: dict[str, tuple[SpecLike, SpecLike, SpecLike | None]] = {
    "rows of x": (("x", None), (None, None), None),
    "contracting": ((None, "x"), ("x", None), None),
    "contracting, out rows": ((None, "x"), ("x", None), ("x", None)),
}


def check_h100_collectives(answer: object) -> Feedback:
    """03.p1 (predict): per case of :data:`MATMUL_CASES`, the collective the H100 program
    runs ("none", or its kind, e.g. "all-gather")."""
    if unanswered(answer):
        return judge("03.p1", answer, False, "", "")
    expected = {}
    for case, specs in MATMUL_CASES.items():
        kinds = [r["kind"] for r in collective_rows(ShardedMatmul({"x": 8}, *specs, "h100").hlo())]
        expected[case] = " + ".join(kinds) or "none"
    if not isinstance(answer, Mapping) or set(answer) != set(expected):
        return Feedback("03.p1", False, True, f"answer a dict with the keys {list(expected)}")
    wrong = [c for c in expected if str(answer[c]).strip().lower() != expected[c]]
    return judge(
        "03.p1",
        answer,
        not wrong,
        "all three right; the next cells show the bytes too.",
        f"not yet for {wrong}: where does a device hold only a partial sum, and who needs "
        "the whole of it?",
    )


def check_fsdp_bytes(answer: object, preset: GPTConfig | str = "tiny") -> Feedback:
    """03.p2 (predict): does FSDP, each parameter gathered once per step and kept for the
    backward pass (as the unrolled GPT step compiles), send "more", "fewer" or the "same"
    bytes per device over ``data`` as DP? By the ring formulas of
    :func:`labkit.parallel.sharding.gradient_sync_bytes`, which model exactly that."""
    if unanswered(answer):
        return judge("03.p2", answer, False, "", "")
    params = gpt_params(preset)
    sync = {s: gradient_sync_bytes(params, s, {"data": 8}) for s in ("dp", "fsdp")}
    sent = {s: sum(kinds.values()) for s, kinds in sync.items()}
    ratio = sent["fsdp"] / sent["dp"]
    regathered = (sent["fsdp"] + sync["fsdp"].get("all-gather", 0.0)) / sent["dp"]
    expected = (
        "same" if math.isclose(ratio, 1.0, rel_tol=1e-9) else ("more" if ratio > 1 else "fewer")
    )
    spellings = {"same": "same", "equal": "same", "more": "more", "fewer": "fewer", "less": "fewer"}
    return check_choice(
        "03.p2",
        answer,
        expected,
        spellings,
        f"{expected}: FSDP / DP = {ratio:.3f} by the ring formulas, one gather per parameter. "
        f"Gathered again for the backward pass it would be {regathered:.2f}.",
        "write each in ring terms: an all-reduce is a reduce-scatter then an all-gather",
    )
