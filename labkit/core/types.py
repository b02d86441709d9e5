"""Type aliases the kit shares, so an annotation says what ``Any`` would hide.

JAX has no static type for a pytree (``jax.typing`` exports ``ArrayLike`` and ``DTypeLike``
only), so :data:`PyTree` is ``Any`` to mypy: it checks nothing, but a reader sees that a
nested structure of arrays is meant, not an arbitrary object.
"""

from __future__ import annotations

from typing import Any

type PyTree = Any
"""A JAX pytree: nested dicts, lists, tuples (and registered nodes) of arrays or
``jax.ShapeDtypeStruct`` s, e.g. a model's params or a train state."""
