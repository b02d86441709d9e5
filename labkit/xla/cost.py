"""What XLA says a compiled program costs: its cost analysis (FLOPs, bytes accessed)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def cost(compiled: Any) -> dict[str, float]:
    """XLA's cost analysis of a compiled executable, as one flat dict (``flops``, bytes...)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, Sequence):  # older jaxlibs returned one dict per device
        analysis = analysis[0] if analysis else {}
    return {str(k): float(v) for k, v in (analysis or {}).items()}


def flops(fn: Callable[..., Any], *args: Any) -> float:
    """FLOPs of one call of ``fn(*args)`` as counted by XLA's cost analysis."""
    import jax

    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    counted = cost(jitted.lower(*args).compile()).get("flops", 0.0)
    if counted <= 0:
        raise ValueError("XLA's cost analysis reported no FLOPs for this function")
    return counted
