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
from collections.abc import Iterator, Mapping

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# Logical axis -> mesh axis, per strategy (MaxText / flax "logical axis rules" style).
# "batch" names the batch dimension of inputs; the others name parameter dimensions.
RULES: dict[str, tuple[tuple[str, str | None], ...]] = {
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
REQUIRED_AXES: dict[str, tuple[str, ...]] = {
    "dp": ("data",),
    "fsdp": ("data",),
    "tp": ("model",),
    "fsdp_tp": ("data", "model"),
}


# ---------------------------------------------------------------------------------------
# Sharding rules


def check_mesh(strategy: str, mesh: Mesh | None) -> None:
    """Raise ValueError for an unknown strategy or a mesh without the axes it needs."""
    if strategy not in RULES:
        raise ValueError(f"unknown sharding strategy {strategy!r}; choose one of {sorted(RULES)}")
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
    names: tuple[str | None, ...], strategy: str, mesh: Mesh | None = None
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


def param_specs(tree: nnx.Module | nnx.State, strategy: str, mesh: Mesh | None = None) -> dict:
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


def check_fits(sizes: Mapping[str, int], mesh: Mesh, strategy: str) -> None:
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


def batch_spec(strategy: str, mesh: Mesh | None = None) -> PartitionSpec:
    """PartitionSpec of an int32 ``(batch, seq + 1)`` batch under ``strategy``."""
    return logical_to_spec(("batch", None), strategy, mesh)


# Activation layouts: inside ``activation_sharding(mesh, strategy)`` the model pins these
# with ``with_sharding_constraint`` so the partitioner does not have to guess (outside, no-op).
RESIDUAL = ("batch", None, None)  # (batch, seq, d_model): replicated features, as in Megatron
_ACTIVATIONS: contextvars.ContextVar[tuple[Mesh, str] | None] = contextvars.ContextVar(
    "labkit_activation_sharding", default=None
)


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, strategy: str) -> Iterator[None]:
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
