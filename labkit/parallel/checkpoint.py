"""Checkpoints of a training state with Orbax: save sharded arrays, restore them in place.

A state is any pytree of ``jax.Array`` s (the GPT's ``{"params": ..., "opt_state": ...}``).
:func:`save` writes it with ``orbax.checkpoint.StandardCheckpointer`` under
``<root>/step_<n>``; :func:`restore` reads it back *into the shardings of an abstract state*
(``ShapeDtypeStruct`` s with ``sharding=``), so a restored state is laid out exactly as the
compiled step expects: no recompile, no resharding. Restored values are bit-identical.
"""

from __future__ import annotations

import re
from pathlib import Path

import jax

from labkit.core.types import PyTree


def step_dir(root: str | Path, step: int) -> Path:
    """The folder of the checkpoint taken after ``step`` steps."""
    return Path(root).resolve() / f"step_{step}"


def save(root: str | Path, state: PyTree, step: int) -> Path:
    """Write ``state`` (a pytree of arrays) as the checkpoint of ``step``; wait until written."""
    import orbax.checkpoint as ocp

    path = step_dir(root, step)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, state, force=True)
    checkpointer.wait_until_finished()
    checkpointer.close()
    return path


def latest_step(root: str | Path) -> int | None:
    """The highest step saved under ``root``, or None when there is none."""
    steps = [
        int(m.group(1))
        for p in Path(root).glob("step_*")
        if (m := re.fullmatch(r"step_(\d+)", p.name))
    ]
    return max(steps, default=None)


def restore(
    root: str | Path, abstract_state: PyTree, step: int | None = None
) -> tuple[PyTree, int]:
    """``(state, step)``: the checkpoint of ``step`` (default: the latest) in ``abstract_state``'s
    shapes, dtypes and shardings."""
    import orbax.checkpoint as ocp

    step = latest_step(root) if step is None else step
    if step is None or not step_dir(root, step).exists():
        raise FileNotFoundError(
            f"no checkpoint {'step_' + str(step) if step is not None else ''} under {root}: "
            "call labkit.parallel.checkpoint.save(root, state, step) first"
        )
    checkpointer = ocp.StandardCheckpointer()
    state = checkpointer.restore(step_dir(root, step), abstract_state)
    checkpointer.close()
    return state, step


def same_values(a: PyTree, b: PyTree) -> bool:
    """True when two pytrees have the same structure and bit-identical leaves."""
    import numpy as np

    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    if str(jax.tree.structure(a)) != str(jax.tree.structure(b)) or len(la) != len(lb):
        return False
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True))
