"""The one mesh builder and the one abstract-input builder of the kit.

:func:`make_mesh` builds a mesh over this process's devices, over a subset of them, or over
compile-only GPUs from a deviceless topology (:func:`labkit.xla.aot.h100_mesh` passes those),
with errors that say what to do. :func:`abstract` turns arrays (or shapes) into sharded
``jax.ShapeDtypeStruct`` s: what ``jit(...).lower(...)`` needs to compile without data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from labkit.core.types import PyTree

if TYPE_CHECKING:  # JAX is imported lazily: env.setup() must run before it starts
    import jax
    from jax.sharding import Mesh, PartitionSpec


def make_mesh(
    shape: Sequence[int],
    names: Sequence[str],
    devices: Sequence[jax.Device] | None = None,
    explicit: bool = False,
) -> Mesh:
    """A ``jax.sharding.Mesh`` of ``shape`` with axis ``names`` over ``devices`` (default: all).

    Axes are ``Auto`` (the partitioner propagates shardings, GSPMD-style) unless ``explicit``:
    jax 0.12's ``jax.make_mesh`` defaults to ``Explicit`` axes, under which
    ``with_sharding_constraint`` and implicit resharding raise.
    """
    import jax
    from jax.sharding import AxisType

    if not isinstance(shape, Sequence) or isinstance(names, str) or not isinstance(names, Sequence):
        raise TypeError(
            f"make_mesh takes a tuple of axis sizes and a tuple of axis names, e.g. "
            f"make_mesh((8,), ('data',)) or make_mesh((4, 2), ('data', 'model')); got "
            f"shape={shape!r}, names={names!r}"
        )
    shape, names = tuple(shape), tuple(names)
    if len(shape) != len(names):
        raise ValueError(f"mesh shape {shape} and axis names {names} differ in length")
    if any(not isinstance(n, int) or n < 1 for n in shape):
        raise ValueError(f"mesh shape {shape} has an axis smaller than 1 (or not an int)")
    if len(set(names)) != len(names):
        raise ValueError(f"mesh axis names {names} repeat a name")
    need = math.prod(shape)
    if devices is None:
        devices = jax.devices()
        if need != len(devices):
            raise ValueError(
                f"mesh {shape} needs {need} devices, found {len(devices)}; on CPU call "
                f"labkit.core.env.setup(cpu_devices={need}) first (restart the kernel), "
                f"or pick a shape whose sizes multiply to {len(devices)}"
            )
    elif need != len(devices):
        raise ValueError(f"mesh {shape} needs {need} devices, but {len(devices)} were given")
    kind = AxisType.Explicit if explicit else AxisType.Auto
    return jax.make_mesh(shape, names, axis_types=(kind,) * len(shape), devices=list(devices))


def abstract(
    tree: PyTree,
    mesh: Mesh,
    spec: PartitionSpec | Callable[[jax.Array], PartitionSpec] | PyTree | None = None,
) -> PyTree:
    """Replace every array in ``tree`` by a ``ShapeDtypeStruct`` sharded on ``mesh``.

    ``spec`` is a PartitionSpec for all leaves, a function ``leaf -> PartitionSpec``, a
    pytree of PartitionSpecs matching ``tree``, or None (replicated). Nothing is allocated.
    """
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    def one(x: jax.Array | jax.ShapeDtypeStruct, s: PartitionSpec) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, s))

    if spec is None:
        spec = PartitionSpec()
    if isinstance(spec, PartitionSpec):
        return jax.tree.map(lambda x: one(x, spec), tree)
    if callable(spec):
        return jax.tree.map(lambda x: one(x, spec(x)), tree)
    return jax.tree.map(one, tree, spec, is_leaf=lambda s: isinstance(s, PartitionSpec))
