"""labkit.xla.memory: the compiler's memory analysis as plain data."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from labkit.xla.memory import Memory, memory


def test_a_donated_buffer_is_aliased_and_counted_once() -> None:
    x = jnp.zeros((256, 256), jnp.float32)  # 262,144 bytes
    compiled = jax.jit(lambda a: a * 2 + 1, donate_argnums=0).lower(x).compile()
    m = memory(compiled)
    assert (m.argument, m.output, m.alias) == (262144, 262144, 262144)
    assert m.total == 262144 + m.temp
    row = m.row("scale")
    assert row["program"] == "scale" and row["argument MB"] == 0.26 and row["alias MB"] == 0.26


def test_total_and_peak_from_a_report() -> None:
    m = Memory(argument=10, output=6, alias=4, temp=100, code=0, peak=None)
    assert m.total == 112 and m.row("x")["peak MB"] is None


def test_no_analysis_says_so() -> None:
    class Blank:
        def memory_analysis(self) -> None:
            return None

    with pytest.raises(ValueError, match="no memory analysis"):
        memory(Blank())  # type: ignore[arg-type]
