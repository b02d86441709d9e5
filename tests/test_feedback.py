"""labkit.core.feedback: answer checking, and expect_error for lessons that show an error."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from labkit.core.feedback import (
    YES_NO,
    ClaimFailed,
    check_choice,
    check_integer,
    check_number,
    claim,
    claim_between,
    expect_error,
    judge,
)


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


def test_claim_prints_what_it_checked_and_returns_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert claim("the DP step has one all-reduce", 1, 1) is None  # a cell shows no Out[]
    claim("bf16 tracks f32", 0.013 <= 0.02, found="gap 0.013")
    claim("error near 2.4e-3", 2.41e-3, 2.4e-3, rel_tol=0.05)
    assert claim_between("loss fell", 2.5, 0.0, 3.0) is None
    assert capsys.readouterr().out.splitlines() == [
        "✓ the DP step has one all-reduce: 1",
        "✓ bf16 tracks f32: gap 0.013",
        "✓ error near 2.4e-3: 0.00241",
        "✓ loss fell: 2.5 (expected 0..3)",
    ]


def test_a_false_claim_fails_the_notebook_and_says_why() -> None:
    with pytest.raises(ClaimFailed, match=r"✗ one all-reduce: found 2, expected 1"):
        claim("one all-reduce", 2, 1)
    with pytest.raises(AssertionError, match="it is false"):  # ClaimFailed is an AssertionError
        claim("loss fell", False)
    with pytest.raises(ClaimFailed, match=r"within 0\.01 relative"):
        claim("close", 1.1, 1.0, rel_tol=0.01)
    with pytest.raises(ClaimFailed, match=r"expected 0\.\.1"):
        claim_between("fraction", 1.5, 0, 1)


def test_a_false_claim_under_other_versions_names_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from labkit.core import env

    with pytest.raises(ClaimFailed) as calibrated:
        claim("one all-reduce", 2, 1)
    assert str(calibrated.value) == "✗ one all-reduce: found 2, expected 1"  # nothing more
    older = dict.fromkeys(("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt"), "0.11.2")
    monkeypatch.setattr(env, "installed_versions", lambda: older)
    with pytest.raises(ClaimFailed) as other:
        claim_between("fraction", 1.5, 0, 1)
    said = str(other.value).splitlines()
    assert said[0] == "✗ fraction: found 1.5, expected 0..1"
    assert said[1] == (
        f"(the lessons' claims are calibrated to jax and jaxlib {env.CALIBRATED}; here: jax "
        "0.11.2, jaxlib 0.11.2, jax-cuda12-plugin 0.11.2, jax-cuda12-pjrt 0.11.2: the "
        "difference may come from them, not the lesson)"
    )
    assert str(pickle.loads(pickle.dumps(other.value))) == str(other.value)  # said once


def test_claim_refuses_an_ambiguous_comparison() -> None:
    import numpy as np

    with pytest.raises(TypeError, match="compare scalars"):
        claim("arrays", np.arange(3), np.arange(3))


FOLD_CELLS = """
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_cell("from labkit.core.feedback import claim, claim_between")
shell.run_cell("claim('one', 1, 1); claim('two', True); claim('three', 3, 3)\\n"
               "claim_between('four', 4.0, 3.0, 5.0)")
shell.run_cell("claim('five', 5, 5)")
"""


def test_a_cell_shows_two_passed_claims_and_folds_the_rest_into_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FOLD_CELLS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "✓ one: 1",
        "✓ two",
        "✓ 2 more checks passed: three; four",
        "✓ five: 5",  # the next cell starts its own count
    ]


def test_outside_ipython_every_claim_prints(capsys: pytest.CaptureFixture[str]) -> None:
    for n in range(4):
        claim(f"claim {n}", n, n)
    assert capsys.readouterr().out.count("✓") == 4


def test_check_choice_takes_spellings_and_names_the_choices() -> None:
    assert check_choice("p", "Yes", "yes", YES_NO, "ok", "hint").passed
    assert check_choice("p", True, "yes", YES_NO, "ok", "hint").passed
    wrong = check_choice("p", "no", "yes", YES_NO, "ok", "hint")
    assert not wrong.passed and wrong.attempted and wrong.message == "hint"
    odd = check_choice("p", "perhaps", "yes", YES_NO, "ok", "hint")
    assert not odd.passed and "['no', 'yes']" in odd.message
    assert not check_choice("p", ..., "yes", YES_NO, "ok", "hint").attempted
