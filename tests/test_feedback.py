"""labkit.core.feedback: answer checking, and expect_error for lessons that show an error."""

from __future__ import annotations

import pytest

from labkit.core.feedback import check_integer, check_number, expect_error, judge


def test_check_number_and_integer() -> None:
    assert check_number("x", 10.2, 10.0, 0.05, "hint").passed
    wrong = check_number("x", 12, 10.0, 0.05, "try again")
    assert not wrong.passed and wrong.attempted and wrong.message == "try again"
    assert not check_number("x", "ten", 10.0, 0.05, "hint").passed
    assert not check_number("x", ..., 10.0, 0.05, "hint").attempted
    assert check_integer("y", "3", 3, "ok", "hint").passed
    assert not check_integer("y", [3], 3, "ok", "hint").passed
    assert str(judge("z", None, False, "ok", "hint")).startswith("[z] to do")


def test_expect_error_prints_and_keeps_the_error(capsys: pytest.CaptureFixture[str]) -> None:
    with expect_error(ValueError, match="bad size") as caught:
        raise ValueError("bad size 3")
    assert isinstance(caught.error, ValueError)
    assert capsys.readouterr().out == "ValueError: bad size 3\n"
    assert caught.message == "ValueError: bad size 3"


def test_expect_error_fails_when_nothing_is_raised() -> None:
    with pytest.raises(AssertionError, match="raised nothing"), expect_error(KeyError):
        pass


def test_expect_error_checks_the_message_and_the_type() -> None:
    with pytest.raises(AssertionError, match="matching 'restart'"), expect_error(match="restart"):
        raise RuntimeError("something else")
    with pytest.raises(TypeError), expect_error(ValueError):  # other types pass through
        raise TypeError("not the expected kind")
