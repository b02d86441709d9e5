"""Exercise checkers: instant feedback in the lesson, assertions in the solutions.

A checker recomputes the right answer from the learner's own inputs with labkit and
compares. It never raises for a wrong answer in a lesson notebook (the lesson must still run
end to end in CI); a solution notebook asserts ``.passed``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from labkit import hlo
from labkit.env import hardware


@dataclasses.dataclass(frozen=True)
class Feedback:
    """The verdict on one answer: ``passed``, and a message for the learner."""

    exercise: str
    passed: bool
    attempted: bool
    message: str

    def __str__(self) -> str:
        mark = "correct" if self.passed else ("not yet" if self.attempted else "to do")
        return f"[{self.exercise}] {mark}: {self.message}"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


def _unanswered(answer: Any) -> bool:
    return answer is None or answer is Ellipsis


def _feedback(exercise: str, answer: Any, passed: bool, ok: str, hint: str) -> Feedback:
    if _unanswered(answer):
        return Feedback(exercise, False, False, "replace ... with your answer and run the cell")
    return Feedback(exercise, passed, True, ok if passed else hint)


def check_number(
    exercise: str, answer: Any, expected: float, rel_tol: float, hint: str
) -> Feedback:
    """Compare a numeric answer with ``expected`` within a relative tolerance."""
    if _unanswered(answer):
        return _feedback(exercise, answer, False, "", hint)
    try:
        value = float(answer)
    except (TypeError, ValueError):
        return Feedback(exercise, False, True, f"expected a number, got {type(answer).__name__}")
    passed = math.isclose(value, expected, rel_tol=rel_tol)
    return _feedback(exercise, answer, passed, f"{value:g} is right.", hint)


# ---- 00_welcome ------------------------------------------------------------------------


def ridge_intensity(gpu: str = "H100 SXM") -> float:
    """FLOPs per byte at which a GPU's dense bf16 peak meets its HBM bandwidth."""
    hw = hardware(gpu)
    return hw.bf16_tflops * 1e12 / (hw.hbm_gbps * 1e9)


def check_ridge_matmul_size(answer: Any, gpu: str = "H100 SXM") -> Feedback:
    """00.1: smallest square bf16 matmul size n that is compute-bound on ``gpu``.

    A bf16 n x n matmul does 2 n^3 FLOPs and moves at least 3 n^2 * 2 bytes, so its
    intensity is n / 3 FLOP/byte; it is compute-bound once n / 3 reaches the ridge.
    """
    expected = 3 * ridge_intensity(gpu)
    return check_number(
        "00.1",
        answer,
        expected,
        0.05,
        "intensity of a bf16 n x n matmul is 2n^3 / (3 * 2 n^2) = n/3 FLOP/byte; "
        "set it equal to peak FLOP/s / bandwidth from labkit.env.hardware(...)",
    )


def check_all_reduce_count(answer: Any, compiled_hlo: str) -> Feedback:
    """00.2: how many all-reduce collectives (async pairs counted once) the HLO has."""
    expected = sum(c.kind == "all-reduce" for c in hlo.collectives(compiled_hlo))
    if _unanswered(answer):
        return _feedback("00.2", answer, False, "", "")
    try:
        passed = int(answer) == expected
    except (TypeError, ValueError):
        return Feedback("00.2", False, True, f"expected an integer, got {type(answer).__name__}")
    return _feedback(
        "00.2",
        answer,
        passed,
        f"{expected} all-reduce(s): one per combined gradient group.",
        "count lines whose op is all-reduce or all-reduce-start (a -done line ends the same "
        "collective); labkit.hlo.collectives(hlo) does this",
    )
