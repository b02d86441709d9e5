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


def check_integer(exercise: str, answer: Any, expected: int, ok: str, hint: str) -> Feedback:
    """Compare an integer answer (a count) with ``expected``."""
    if _unanswered(answer):
        return _feedback(exercise, answer, False, "", hint)
    try:
        passed = int(answer) == expected
    except (TypeError, ValueError):
        return Feedback(exercise, False, True, f"expected an integer, got {type(answer).__name__}")
    return _feedback(exercise, answer, passed, ok, hint)


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
    return check_integer(
        "00.2",
        answer,
        expected,
        f"{expected} all-reduce(s): one per combined gradient group.",
        "count lines whose op is all-reduce or all-reduce-start (a -done line ends the same "
        "collective); labkit.hlo.collectives(hlo) does this",
    )


# ---- 06_collective_flags ---------------------------------------------------------------


def check_async_replacement(answer: Any) -> Feedback:
    """06.1: the flag that replaced ``--xla_gpu_enable_async_collectives``."""
    import re

    from labkit.flags import REMOVED

    text = REMOVED["xla_gpu_enable_async_collectives"].replacement
    expected = re.search(r"--(\w+)", text).group(1)  # type: ignore[union-attr]
    name = str(answer).strip().lstrip("-").partition("=")[0]
    return _feedback(
        "06.1",
        answer,
        name == expected,
        f"--{expected}: async is the default now; this flag lists the types to make synchronous.",
        "labkit.flags.validate(flags.RECOMMENDED_2023) says what replaced it (the 'instead' text)",
    )


def count_all_reduces(threshold: int, preset: str = "tiny", batch_size: int = 32) -> int:
    """All-reduces in the data-parallel GPT step compiled for 8 H100s with this threshold."""
    from labkit import collectives

    options = {"xla_gpu_all_reduce_combine_threshold_bytes": int(threshold)}
    compiled = collectives.compile_step(preset, "dp", options, batch_size=batch_size)
    return sum(c.kind == "all-reduce" for c in hlo.collectives(compiled.hlo))


def check_two_all_reduce_groups(answer: Any, count: Any = None, preset: str = "tiny") -> Feedback:
    """06.2: a combine threshold under which the DP step has exactly two all-reduces.

    Recompiles the step with the answer; ``count(threshold) -> int`` replaces that in tests.
    """
    if _unanswered(answer):
        return _feedback("06.2", answer, False, "", "")
    if isinstance(answer, bool) or not isinstance(answer, int) or answer < 0:
        return Feedback("06.2", False, True, f"expected a number of bytes >= 0, got {answer!r}")
    found = (count or (lambda t: count_all_reduces(t, preset)))(answer)
    return _feedback(
        "06.2",
        answer,
        found == 2,
        f"{answer} bytes gives exactly two all-reduces.",
        f"{answer} bytes gives {found} all-reduce(s); two groups must each stay under the "
        "threshold, and one group must not fit: compare with sum(gradient_sizes().values())",
    )


def check_sync_count(answer: Any, compiled_hlo: str) -> Feedback:
    """06.3: how many all-reduces in ``compiled_hlo`` are synchronous (no start/done pair)."""
    expected = sum(c.kind == "all-reduce" and not c.is_async for c in hlo.collectives(compiled_hlo))
    return check_integer(
        "06.3",
        answer,
        expected,
        f"{expected}: with nothing scheduled in between, XLA makes the pair one synchronous op.",
        "count the all-reduce ops that are not all-reduce-start: labkit.collectives."
        "schedule_table(hlo) marks each row 'sync' or 'async'",
    )


def check_pipelining_options(answer: Any, compile_hlo: Any = None) -> Feedback:
    """06.4: per-compile options (no XLA_FLAGS) that pipeline the scanned FSDP all-gathers.

    Compiles the scanned tiny GPT's FSDP step with ``answer`` and looks for all-gather starts
    marked ``"is_pipelined":true``; ``compile_hlo(options) -> str`` replaces the compile in tests.
    """
    if _unanswered(answer):
        return _feedback("06.4", answer, False, "", "")
    if not isinstance(answer, dict):
        return Feedback("06.4", False, True, f"expected a dict of options, got {answer!r}")
    from labkit import collectives

    def default(options: dict[str, Any]) -> str:
        return collectives.compile_step("tiny", "fsdp", options, scan_layers=True).hlo

    try:
        text = (compile_hlo or default)(dict(answer))
    except Exception as exc:  # XLA's JaxRuntimeError for an unknown option or value
        return Feedback(
            "06.4",
            False,
            True,
            f"XLA rejected it: {str(exc).splitlines()[0][:160]}. The 2023 names work only in "
            "XLA_FLAGS; per compile use the option they set, with its full enum value "
            "(labkit.flags.compile_options translates)",
        )
    piped = [
        i
        for i in hlo.instructions(text)
        if i.opcode == "all-gather-start" and collectives.is_pipelined(i)
    ]
    return _feedback(
        "06.4",
        answer,
        bool(piped),
        f"{len(piped)} pipelined all-gather start(s), without touching XLA_FLAGS.",
        "no all-gather is marked is_pipelined; which DebugOptions field does "
        "--xla_gpu_enable_pipelined_all_gather set? (labkit.flags.describe)",
    )
