"""Type aliases the kit shares, so an annotation says what ``Any`` would hide.

JAX has no static type for a pytree (``jax.typing`` exports ``ArrayLike`` and ``DTypeLike``
only), so :data:`PyTree` is ``Any`` to mypy: it checks nothing, but a reader sees that a
nested structure of arrays is meant, not an arbitrary object.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

type PyTree = Any
"""A JAX pytree: nested dicts, lists, tuples (and registered nodes) of arrays or
``jax.ShapeDtypeStruct`` s, e.g. a model's params or a train state."""

type JSON = str | int | float | bool | list[JSON] | dict[str, JSON] | None
"""A JSON value, as ``json.dumps`` writes it and ``json.loads`` reads it back."""

type CompilerOption = str | bool | int | float
"""One value of a per-compile XLA option: what jaxlib's ``CompileOptions.env_option_overrides``
takes (``("xla_gpu_enable_triton_gemm", False)``, ``("optimization_level", "O1")``)."""

type CompilerOptions = Mapping[str, CompilerOption]
"""XLA options for one compile, by name: what ``jax.jit(..., compiler_options=...)`` and
``Lowered.compile(compiler_options=...)`` accept (pass ``dict(options)``: JAX wants a dict)."""
