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


def test_parts_add_up_to_the_total_and_draw_against_an_h100() -> None:
    from labkit.xla.memory import picture

    m = Memory(10_000_000, 6_000_000, 4_000_000, 100_000_000, code=0, peak=None)
    assert m.parts() == {
        "arguments": 10_000_000,
        "outputs not in place": 2_000_000,
        "temporaries": 100_000_000,
    }
    assert sum(m.parts().values()) == m.total
    shown = picture({"dp": m}, "Memory", limits={"limit": 200e6})
    assert shown.figure is not None
    left, right = shown.figure.axes
    assert len(left.patches) == 3 and [ln.get_xdata()[0] for ln in right.lines] == [80e9, 200e6]
    assert shown.caption == (
        "dp: arguments 10 + outputs not in place 2 + temporaries 100 = 112 MB "
        "(0.14% of H100 SXM 80 GB, 56% of limit)."
    )
