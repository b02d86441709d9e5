"""Logical-axis sharding rules: one model definition, many parallelism strategies.

Parameters carry *logical* axis names (``"embed"``, ``"heads"``, ``"mlp"``, ``"vocab"``,
``"layers"``) instead of mesh axes. A strategy in :data:`RULES` maps logical names to mesh
axes, so the same GPT serves data parallelism (``"dp"``), FSDP (``"fsdp"``), Megatron-style
tensor parallelism (``"tp"``) and both at once (``"fsdp_tp"``). Sharded steps also pin
activations through :func:`activation_sharding`, so the partitioner does not have to guess.
This module knows no model: it takes logical names and sizes. Meshes come from
:func:`labkit.core.mesh.make_mesh`.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Literal, Protocol, TypeGuard

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from labkit.core.figures import Picture, layout_grids
from labkit.core.types import PyTree


class ShapedSharded(Protocol):
    """What :func:`layout_picture` draws: a ``jax.Array``, or a ``ShapeDtypeStruct`` with a
    sharding."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> object: ...

    @property
    def sharding(self) -> jax.sharding.Sharding: ...


type Strategy = Literal["dp", "fsdp", "tp", "fsdp_tp"]
"""A parallelism strategy: a key of :data:`RULES`. Where a name arrives as a plain ``str``
(a notebook parameter, the command line), :func:`as_strategy` checks it."""

# Logical axis -> mesh axis, per strategy (MaxText / flax "logical axis rules" style).
# "batch" names the batch dimension of inputs; the others name parameter dimensions.
RULES: dict[Strategy, tuple[tuple[str, str | None], ...]] = {
    # Data parallel: every device holds all params; the batch is split over "data".
    "dp": (
        ("batch", "data"),
        ("vocab", None),
        ("embed", None),
        ("heads", None),
        ("mlp", None),
        ("layers", None),
    ),
    # Fully sharded data parallel (ZeRO-3): params split over "data" on their embed axis.
    "fsdp": (
        ("batch", "data"),
        ("vocab", None),
        ("embed", "data"),
        ("heads", None),
        ("mlp", None),
        ("layers", None),
    ),
    # Megatron tensor parallel: attention heads and MLP hidden units split over "model".
    # The batch is split over "data" when the mesh has that axis, else replicated.
    "tp": (
        ("batch", "data"),
        ("vocab", None),
        ("embed", None),
        ("heads", "model"),
        ("mlp", "model"),
        ("layers", None),
    ),
    # 2-D: FSDP over "data" and tensor parallel over "model".
    "fsdp_tp": (
        ("batch", "data"),
        ("vocab", None),
        ("embed", "data"),
        ("heads", "model"),
        ("mlp", "model"),
        ("layers", None),
    ),
}
# Mesh axes a strategy cannot work without (other mesh axes in its rules are optional).
REQUIRED_AXES: dict[Strategy, tuple[str, ...]] = {
    "dp": ("data",),
    "fsdp": ("data",),
    "tp": ("model",),
    "fsdp_tp": ("data", "model"),
}


# The 8-device mesh each strategy uses in the lessons (virtual CPUs or H100s): shape, axes.
# Tensor parallel runs 2-way over "model" inside 4-way data parallelism.
STRATEGY_MESHES: dict[Strategy, tuple[tuple[int, ...], tuple[str, ...]]] = {
    "dp": ((8,), ("data",)),
    "fsdp": ((8,), ("data",)),
    "tp": ((4, 2), ("data", "model")),
}


def is_strategy(name: object) -> TypeGuard[Strategy]:
    """True if ``name`` is one of the strategies of :data:`RULES`."""
    return isinstance(name, str) and name in RULES


def as_strategy(name: object) -> Strategy:
    """``name`` as a :data:`Strategy`; ValueError naming the known ones for anything else."""
    if not is_strategy(name):
        raise ValueError(f"unknown sharding strategy {name!r}; choose one of {sorted(RULES)}")
    return name


def strategy_mesh(strategy: Strategy, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The mesh of :data:`STRATEGY_MESHES` over ``devices`` (default: 8 compile-only H100s).

    With 8 or more devices the first 8 take the strategy's shape; with fewer (one GPU, four
    CPUs), a 1-D strategy takes them all and a 2-D one keeps 2 on "model" when it can.
    """
    from labkit.core.mesh import make_mesh

    if strategy not in STRATEGY_MESHES:
        raise ValueError(
            f"unknown sharding strategy {strategy!r}; choose one of {sorted(STRATEGY_MESHES)}"
        )
    shape, names = STRATEGY_MESHES[strategy]
    if devices is None:
        from labkit.xla.aot import h100_mesh

        return h100_mesh(shape, names)
    devices = list(devices)
    if len(devices) >= math.prod(shape):
        devices = devices[: math.prod(shape)]
    elif len(names) == 1:
        shape = (len(devices),)
    else:
        model = 2 if len(devices) % 2 == 0 else 1
        shape = (len(devices) // model, model)
    return make_mesh(shape, names, devices=devices)


# ---------------------------------------------------------------------------------------
# Sharding rules


def check_mesh(strategy: Strategy, mesh: Mesh | None) -> None:
    """Raise ValueError for an unknown strategy or a mesh without the axes it needs."""
    strategy = as_strategy(strategy)  # a str from a caller mypy does not check
    if mesh is None:
        return
    missing = [a for a in REQUIRED_AXES[strategy] if a not in mesh.axis_names]
    if missing:
        raise ValueError(
            f"strategy {strategy!r} needs mesh axes {REQUIRED_AXES[strategy]}, but the mesh has "
            f"{tuple(mesh.axis_names)} (missing {tuple(missing)}); build it with e.g. "
            f"jax.make_mesh(sizes, {REQUIRED_AXES[strategy]}, axis_types=(AxisType.Auto,) * n)"
        )


def logical_to_spec(
    names: tuple[str | None, ...], strategy: Strategy, mesh: Mesh | None = None
) -> PartitionSpec:
    """PartitionSpec for a tuple of logical axis names under ``strategy``.

    With a ``mesh``, optional mesh axes it lacks (``"data"`` for ``"tp"``) become None.
    """
    check_mesh(strategy, mesh)
    rules = dict(RULES[strategy])
    axes = []
    for name in names:
        if name is not None and name not in rules:
            raise ValueError(f"logical axis {name!r} has no rule; known: {sorted(rules)}")
        axis = None if name is None else rules[name]
        if mesh is not None and axis is not None and axis not in mesh.axis_names:
            axis = None
        axes.append(axis)
    return PartitionSpec(*axes)


def param_specs(
    tree: nnx.Module | nnx.State[str | int, PyTree], strategy: Strategy, mesh: Mesh | None = None
) -> dict[str, PyTree]:
    """PartitionSpecs for a model's params, as a nested dict like ``nnx.to_pure_dict``.

    ``tree`` is a GPT (real or from ``nnx.eval_shape``) or its ``nnx.State``. With a
    ``mesh``, also checks that every sharded dimension divides by its mesh axis size.
    """
    state = nnx.state(tree) if isinstance(tree, nnx.Module) else tree
    check_mesh(strategy, mesh)
    flat = {}
    for path, var in nnx.to_flat_state(state):
        names = var.get_metadata().get("out_sharding") or (None,) * len(var.shape)
        spec = logical_to_spec(tuple(names), strategy, mesh)
        if mesh is not None:
            for size, axis in zip(var.shape, spec, strict=True):
                if axis is not None and size % mesh.shape[axis]:
                    raise ValueError(
                        f"param {'/'.join(map(str, path))} {var.shape}: dimension {size} does "
                        f"not divide by mesh axis {axis!r} of size {mesh.shape[axis]}"
                    )
        flat[path] = spec
    return nnx.traversals.unflatten_mapping(flat)


def check_fits(sizes: Mapping[str, int], mesh: Mesh, strategy: Strategy) -> None:
    """Raise ValueError when a logical dimension's size does not split over its mesh axis.

    ``sizes`` maps logical axis names to sizes, e.g. ``{"heads": 4, "mlp": 512}``.
    """
    check_mesh(strategy, mesh)
    for name, axis in RULES[strategy]:
        if name in sizes and axis in mesh.axis_names and sizes[name] % mesh.shape[axis]:
            given = ", ".join(f"{k}={v}" for k, v in sizes.items())
            raise ValueError(
                f"strategy {strategy!r} splits {name!r} ({sizes[name]}) over mesh axis "
                f"{axis!r} of size {mesh.shape[axis]}, which does not divide it; change the "
                f"mesh or the sizes ({given})"
            )


def batch_spec(strategy: Strategy, mesh: Mesh | None = None) -> PartitionSpec:
    """PartitionSpec of an int32 ``(batch, seq + 1)`` batch under ``strategy``."""
    return logical_to_spec(("batch", None), strategy, mesh)


# Activation layouts: inside ``activation_sharding(mesh, strategy)`` the model pins these
# with ``with_sharding_constraint`` so the partitioner does not have to guess (outside, no-op).
RESIDUAL = ("batch", None, None)  # (batch, seq, d_model): replicated features, as in Megatron
_ACTIVATIONS: contextvars.ContextVar[tuple[Mesh, Strategy] | None] = contextvars.ContextVar(
    "labkit_activation_sharding", default=None
)


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, strategy: Strategy) -> Iterator[None]:
    """While tracing inside this context, activations follow ``strategy``'s rules on ``mesh``."""
    check_mesh(strategy, mesh)
    token = _ACTIVATIONS.set((mesh, strategy))
    try:
        yield
    finally:
        _ACTIVATIONS.reset(token)


def constrain(x: jax.Array, names: tuple[str | None, ...]) -> jax.Array:
    """Pin ``x`` to the layout of logical axes ``names`` if :func:`activation_sharding` is on."""
    current = _ACTIVATIONS.get()
    if current is None:
        return x
    mesh, strategy = current
    spec = logical_to_spec(names, strategy, mesh)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


# ---------------------------------------------------------------------------------------
# Communication from first principles (ring algorithms) and per-device memory

# Collective kinds as XLA names them, with the fraction of the *full* buffer S that each
# device sends in a ring of n devices (NCCL's bandwidth-optimal algorithms): an all-reduce
# is a reduce-scatter then an all-gather, 2(n-1)/n * S; all-gather and reduce-scatter move
# (n-1)/n * S; an all-to-all keeps 1/n of its own buffer and sends the rest; a
# collective-permute sends its whole operand once.
RING_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
Params = Mapping[str, tuple[tuple[str | None, ...], tuple[int, ...], int]]


def ring_bytes(kind: str, size: float, n: int) -> float:
    """Bytes one device sends for a ring ``kind`` collective on a ``size``-byte buffer over n.

    ``size`` is the full buffer (what ``labkit.xla.hlo.Collective.bytes`` reports): the
    gathered result of an all-gather, the unscattered input of a reduce-scatter, the
    per-device operand of an all-to-all or collective-permute.
    """
    if kind not in RING_KINDS:
        raise ValueError(f"unknown collective kind {kind!r}; choose one of {RING_KINDS}")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"group size n must be a positive int, got {n!r}")
    if size < 0:
        raise ValueError(f"buffer size must be >= 0 bytes, got {size}")
    if n == 1:
        return 0.0
    factor = {"all-reduce": 2 * (n - 1) / n, "collective-permute": 1.0}.get(kind, (n - 1) / n)
    return factor * size


def axis_size(entry: str | tuple[str, ...] | None, axis_sizes: Mapping[str, int]) -> int:
    """How many pieces one PartitionSpec entry cuts a dimension into (1 for None)."""
    if entry is None:
        return 1
    names = (entry,) if isinstance(entry, str) else tuple(entry)
    missing = [a for a in names if a not in axis_sizes]
    if missing:
        raise ValueError(f"mesh axes {missing} not in the mesh {dict(axis_sizes)}")
    out = 1
    for a in names:
        out *= axis_sizes[a]
    return out


def shard_shape(
    shape: tuple[int, ...], spec: PartitionSpec, axis_sizes: Mapping[str, int]
) -> tuple[int, ...]:
    """The shape of one device's block of a ``shape`` array laid out by ``spec``."""
    entries = tuple(spec) + (None,) * (len(shape) - len(spec))
    if len(entries) != len(shape):
        raise ValueError(f"spec {spec} has more entries than the array {shape} has dimensions")
    out = []
    for size, entry in zip(shape, entries, strict=True):
        parts = axis_size(entry, axis_sizes)
        if size % parts:
            raise ValueError(f"dimension {size} of {shape} does not divide into {parts} ({spec})")
        out.append(size // parts)
    return tuple(out)


def _spec_of(
    names: tuple[str | None, ...], strategy: Strategy, axis_sizes: Mapping[str, int]
) -> PartitionSpec:
    rules = dict(RULES[strategy])
    return PartitionSpec(
        *(None if n is None or rules.get(n) not in axis_sizes else rules[n] for n in names)
    )


def _check_axes(strategy: Strategy, axis_sizes: Mapping[str, int]) -> None:
    check_mesh(strategy, None)
    missing = [a for a in REQUIRED_AXES[strategy] if a not in axis_sizes]
    if missing:
        raise ValueError(f"strategy {strategy!r} needs mesh axes {missing}; got {dict(axis_sizes)}")


def param_bytes_per_device(
    params: Params, strategy: Strategy, axis_sizes: Mapping[str, int]
) -> int:
    """Parameter bytes one device holds under ``strategy``.

    ``params`` maps a name to ``(logical axis names, shape, itemsize)``.
    """
    _check_axes(strategy, axis_sizes)
    total = 0
    for names, shape, itemsize in params.values():
        block = shard_shape(shape, _spec_of(names, strategy, axis_sizes), axis_sizes)
        total += math.prod(block) * itemsize
    return total


def gradient_sync_bytes(
    params: Params, strategy: Strategy, axis_sizes: Mapping[str, int]
) -> dict[str, float]:
    """Predicted bytes each device sends per step to synchronise parameters and gradients.

    Over the ``"data"`` axis (n devices): a parameter sharded over it is all-gathered for
    the forward pass and its gradient reduce-scattered; any other gradient is all-reduced.
    Returns bytes per collective kind. Activation traffic (tensor parallelism) is not here:
    it depends on the model, not on its parameters.
    """
    _check_axes(strategy, axis_sizes)
    n = axis_sizes.get("data", 1)
    out = {"all-reduce": 0.0, "all-gather": 0.0, "reduce-scatter": 0.0}
    for names, shape, itemsize in params.values():
        spec = _spec_of(names, strategy, axis_sizes)
        local = math.prod(shard_shape(shape, spec, axis_sizes)) * itemsize
        if any(e == "data" or (isinstance(e, tuple) and "data" in e) for e in spec):
            out["all-gather"] += ring_bytes("all-gather", local * n, n)
            out["reduce-scatter"] += ring_bytes("reduce-scatter", local * n, n)
        else:
            out["all-reduce"] += ring_bytes("all-reduce", local, n)
    return {k: v for k, v in out.items() if v}


def hlo_ring_bytes(hlo_text: str) -> dict[str, float]:
    """Bytes each device sends per collective kind, read from compiled HLO (ring formulas)."""
    from labkit.xla import hlo

    out: dict[str, float] = {}
    for c in hlo.collectives(hlo_text):
        if c.kind in RING_KINDS and c.group_size:
            out[c.kind] = out.get(c.kind, 0.0) + ring_bytes(c.kind, c.bytes, c.group_size)
    return out


def choose_strategy(
    candidates: Mapping[str, tuple[float, float]], memory_limit: float | None = None
) -> str:
    """The candidate with the fewest bytes sent that fits ``memory_limit`` bytes per device.

    ``candidates`` maps a name to ``(bytes sent per device, bytes held per device)``; equal
    traffic is broken by the smaller memory, then by name.
    """
    fits = {k: v for k, v in candidates.items() if memory_limit is None or v[1] <= memory_limit}
    if not fits:
        if not candidates:
            raise ValueError("no candidate strategies given")
        name, (_, need) = min(candidates.items(), key=lambda kv: kv[1][1])
        raise ValueError(
            f"no strategy fits {memory_limit} bytes per device; the smallest, {name!r}, needs "
            f"{need}: raise the limit or add devices"
        )
    return min(fits, key=lambda k: (fits[k][0], fits[k][1], k))


# ---------------------------------------------------------------------------------------
# Layouts: which devices hold which block of a 2-D array


def layout_grid(
    shape: tuple[int, int], spec: PartitionSpec, mesh_shape: Mapping[str, int]
) -> list[list[tuple[int, ...]]]:
    """Device ids holding each block of a 2-D array: ``grid[i][j]`` for block (i, j).

    Devices are numbered row-major over the mesh axes in ``mesh_shape``'s order, as
    :func:`labkit.core.mesh.make_mesh` lays out ``jax.devices()``.
    """
    if len(shape) != 2:
        raise ValueError(f"layout_grid draws 2-D arrays, got shape {shape}")
    names, sizes = list(mesh_shape), list(mesh_shape.values())
    entries = tuple(spec) + (None,) * (2 - len(spec))
    axes = [() if e is None else ((e,) if isinstance(e, str) else tuple(e)) for e in entries]
    used = [a for ax in axes for a in ax]
    if len(used) != len(set(used)):
        raise ValueError(f"spec {spec} uses a mesh axis twice")
    blocks = shard_shape(shape, spec, mesh_shape)  # raises when a dimension does not divide
    counts = [shape[d] // blocks[d] for d in range(2)]
    grid: list[list[list[int]]] = [[[] for _ in range(counts[1])] for _ in range(counts[0])]
    for device in range(math.prod(sizes)):
        coords, rest = {}, device
        for name, size in zip(reversed(names), reversed(sizes), strict=True):
            coords[name], rest = rest % size, rest // size
        index = []
        for ax in axes:
            i = 0
            for a in ax:
                i = i * mesh_shape[a] + coords[a]
            index.append(i)
        grid[index[0]][index[1]].append(device)
    return [[tuple(cell) for cell in row] for row in grid]


def layout_text(grid: list[list[tuple[int, ...]]]) -> str:
    """A text table of :func:`layout_grid`: one cell per block, the devices that hold it."""
    cells = [[",".join(map(str, c)) for c in row] for row in grid]
    width = max(len(c) for row in cells for c in row)
    line = "+" + "+".join("-" * (width + 2) for _ in cells[0]) + "+"
    body = [line]
    for row in cells:
        body += ["| " + " | ".join(c.center(width) for c in row) + " |", line]
    return "\n".join(body)


def scanned_tanh_loss(ws: jax.Array, x: jax.Array) -> jax.Array:
    """``mean(h * h)`` of a tanh MLP run by ``lax.scan`` over ``ws`` (layers, width, width):
    one matmul and one tanh per layer, the smallest model whose FSDP step gathers per layer."""
    import jax.numpy as jnp

    def layer(h: jax.Array, w: jax.Array) -> tuple[jax.Array, None]:
        return jnp.tanh(h @ w), None  # (batch, width)

    h, _ = jax.lax.scan(layer, x, ws)
    return jnp.mean(h * h)


# ---------------------------------------------------------------------------------------
# A learner's own array, drawn


def array_grid(x: ShapedSharded) -> list[list[tuple[int, ...]]]:
    """Device ids holding each block of ``x`` (a 1-D or 2-D array, or a ``ShapeDtypeStruct``
    with a sharding): read from ``x.sharding``, so any sharding works, every process's
    devices included. A 1-D array is one row of blocks."""
    shape = tuple(x.shape)
    if len(shape) not in (1, 2):
        raise ValueError(
            f"the layout picture draws 1-D and 2-D arrays, got shape {shape}: draw a 2-D "
            "slice's layout (x[0]) or reshape it"
        )
    starts: list[set[int]] = [set(), set()]
    placed: dict[int, tuple[int, int]] = {}
    indices: Mapping[jax.Device, tuple[slice, ...]] = x.sharding.devices_indices_map(shape)
    for device, index in indices.items():
        begin = [s.start or 0 for s in index] if len(shape) == 2 else [0, index[0].start or 0]
        placed[device.id] = (begin[0], begin[1])
        for d in range(2):
            starts[d].add(begin[d])
    order = [sorted(s) for s in starts]
    grid: list[list[list[int]]] = [[[] for _ in order[1]] for _ in order[0]]
    for device, (row, col) in sorted(placed.items()):
        grid[order[0].index(row)][order[1].index(col)].append(device)
    return [[tuple(cell) for cell in row] for row in grid]


def layout_picture(x: ShapedSharded, name: str = "x") -> Picture:
    """The picture of how ``x`` is laid out: one coloured block per shard, labelled with the
    devices that hold it (and their processes, when there are several)."""
    grid = array_grid(x)
    devices: set[jax.Device] = x.sharding.device_set
    processes = {d.id: d.process_index for d in devices}
    many = len(set(processes.values())) > 1
    spec = getattr(x.sharding, "spec", None)
    mesh = getattr(x.sharding, "mesh", None)
    label = f"{name} {tuple(x.shape)} {x.dtype}" + (f", {spec}" if spec is not None else "")
    where = f"Mesh {dict(mesh.shape)}, " if mesh is not None else ""
    note = f"{where}{len(devices)} devices" + (
        f" in {len(set(processes.values()))} processes." if many else "."
    )
    return layout_grids(
        {label: grid}, f"How {name} is laid out", processes=processes if many else None, note=note
    )


def show(x: ShapedSharded, name: str = "x") -> None:
    """Display :func:`layout_picture` of ``x`` (in a terminal: its text form)."""
    layout_picture(x, name).show()
