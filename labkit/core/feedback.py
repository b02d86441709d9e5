"""Exercise feedback, a lesson's checked claims, and expected errors.

- A checker recomputes the right answer from the learner's own inputs with labkit and
  compares. It never raises for a wrong answer in a lesson notebook (the lesson must still
  run end to end in CI); a solution notebook asserts ``.passed``.
- :func:`claim` and :func:`claim_between` state what a lesson teaches as one printed line
  (what was checked, what was found) and raise :class:`ClaimFailed` when it no longer holds,
  so a drifting JAX fails the notebook instead of teaching wrong output. In a notebook a cell
  shows its first :data:`SHOWN_PER_CELL` passed claims; the rest fold into one line at the
  cell's end (``✓ 3 more checks passed: ...``). A failed claim always shows.
- :func:`expect_error` shows an error a lesson teaches without failing the notebook.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, SupportsFloat, SupportsIndex, SupportsInt

import numpy as np

from labkit.core import progress
from labkit.core.env import version_difference

if TYPE_CHECKING:
    from IPython.lib.pretty import PrettyPrinter


@dataclasses.dataclass(frozen=True)
class Feedback:
    """The verdict on one answer: ``passed``, and a message for the learner."""

    exercise: str
    passed: bool
    attempted: bool
    message: str

    def __post_init__(self) -> None:
        # Every verdict, wherever a checker makes it; written only where LABKIT_PROGRESS is set.
        progress.record(self.exercise, self.passed, self.attempted)

    def __str__(self) -> str:
        mark = "correct" if self.passed else ("not yet" if self.attempted else "to do")
        return f"[{self.exercise}] {mark}: {self.message}"

    def _repr_pretty_(self, printer: PrettyPrinter, cycle: bool) -> None:
        printer.text(str(self))


def unanswered(answer: object) -> bool:
    """True for ``None`` or ``...``: the learner has not answered yet."""
    return answer is None or answer is Ellipsis


def judge(
    exercise: str, answer: object, passed: bool, ok: str, hint: str, *, choice: bool = False
) -> Feedback:
    """Feedback for an answer judged ``passed``: ``ok`` or ``hint``, or 'to do' if unanswered.

    Where ``LABKIT_ANSWER_LOG`` names a file, an accepted answer is appended to it
    (:func:`log_answer`); ``choice``: the answer is one of a few named options.
    """
    if unanswered(answer):
        return Feedback(exercise, False, False, "replace ... with your answer and run the cell")
    if passed:
        log_answer(exercise, answer, choice=choice)
    return Feedback(exercise, passed, True, ok if passed else hint)


ANSWER_LOG = "LABKIT_ANSWER_LOG"


def log_answer(exercise: str, answer: object, *, choice: bool = False) -> None:
    """Append ``{"exercise", "answer", "choice"}`` (one JSON line) to the file
    ``$LABKIT_ANSWER_LOG`` names; nothing when it is unset. The tests set it while a solution
    runs, to check that no lesson prints an exercise's answer above the exercise (a choice's
    options are printed by design, so a choice is not looked for). Numbers and strings are
    kept as they are, tuples, lists and dicts of them as their ``repr``, anything else as its
    type."""
    path = os.environ.get(ANSWER_LOG)
    if not path:
        return
    value: object
    if isinstance(answer, bool | int | float | str):
        value = answer
    elif isinstance(answer, np.integer | np.floating):
        value = answer.item()
    elif isinstance(answer, tuple | list | dict) and len(repr(answer)) <= 200:
        value = repr(answer)
    else:
        value = {"type": type(answer).__name__}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"exercise": exercise, "answer": value, "choice": choice}) + "\n")


def check_number(
    exercise: str, answer: object, expected: float, rel_tol: float, hint: str
) -> Feedback:
    """Compare a numeric answer with ``expected`` within a relative tolerance."""
    if unanswered(answer):
        return judge(exercise, answer, False, "", hint)
    try:
        value = _float(answer)
    except (TypeError, ValueError):
        return Feedback(exercise, False, True, f"expected a number, got {type(answer).__name__}")
    passed = math.isclose(value, expected, rel_tol=rel_tol)
    return judge(exercise, answer, passed, f"{value:g} is right.", hint)


def check_integer(exercise: str, answer: object, expected: int, ok: str, hint: str) -> Feedback:
    """Compare an integer answer (a count) with ``expected``."""
    if unanswered(answer):
        return judge(exercise, answer, False, "", hint)
    try:
        passed = _int(answer) == expected
    except (TypeError, ValueError):
        return Feedback(exercise, False, True, f"expected an integer, got {type(answer).__name__}")
    return judge(exercise, answer, passed, ok, hint)


def check_choice(
    exercise: str, answer: object, expected: str, aliases: Mapping[str, str], ok: str, hint: str
) -> Feedback:
    """Compare a one-word answer with ``expected``; ``aliases`` maps each accepted spelling
    (lower case) to its choice, and the choices are its values."""
    if unanswered(answer):
        return judge(exercise, answer, False, "", hint)
    choices = sorted(set(aliases.values()))
    choice = aliases.get(str(answer).strip().lower())
    if choice is None:
        return Feedback(exercise, False, True, f"answer one of {choices}, got {answer!r}")
    return judge(exercise, answer, choice == expected, ok, hint, choice=True)


YES_NO = {"yes": "yes", "true": "yes", "no": "no", "false": "no"}  # for check_choice


class ClaimFailed(AssertionError):
    """A lesson's claim does not hold on this machine's JAX: the lesson teaches something false.

    Where jax, jaxlib or the CUDA plugin is not the version the lessons are calibrated to, the
    message says so: the difference may come from the version rather than from the lesson.
    """

    def __init__(self, message: str) -> None:
        difference = version_difference()
        if difference is not None and difference not in message:  # not again when unpickled
            message += f"\n({difference}: the difference may come from them, not the lesson)"
        super().__init__(message)


def _float(value: object) -> float:
    """``float(value)``; TypeError for what ``float`` cannot take (``None``, a list)."""
    if not isinstance(value, str | bytes | SupportsFloat | SupportsIndex):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _int(value: object) -> int:
    """``int(value)``; TypeError for what ``int`` cannot take (``None``, a list)."""
    if not isinstance(value, str | bytes | SupportsInt | SupportsIndex):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return int(value)


def _show(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


SHOWN_PER_CELL = 2  # passed claims a notebook cell shows in full; the rest fold into one line


@dataclasses.dataclass
class _CellClaims:
    """The running cell's passed claims, in IPython: the first few print, the rest fold into
    one line printed when the cell ends (IPython's ``post_run_cell`` event)."""

    shown: int = 0
    folded: list[str] = dataclasses.field(default_factory=list)
    hooked: bool = False

    def start(self, *_: object) -> None:
        self.shown, self.folded = 0, []

    def end(self, *_: object) -> None:
        if self.folded:
            more = len(self.folded)
            print(f"✓ {more} more check{'s' if more > 1 else ''} passed: {'; '.join(self.folded)}")
        self.start()

    def passed(self, line: str, statement: str) -> None:
        """Print ``line`` (outside IPython always; in a cell, the first few) or fold it."""
        if not self.hooked and not self._hook():
            print(line)
        elif self.shown < SHOWN_PER_CELL:
            self.shown += 1
            print(line)
        else:
            self.folded.append(statement)

    def _hook(self) -> bool:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
        if shell is None:
            return False
        shell.events.register("pre_run_cell", self.start)
        shell.events.register("post_run_cell", self.end)
        self.hooked = True
        return True


_CELL = _CellClaims()


def claim(
    statement: str,
    got: object,
    expected: object = True,
    *,
    rel_tol: float | None = None,
    abs_tol: float | None = None,
    found: object = None,
) -> None:
    """Check a lesson's claim and print one line saying so (it returns nothing, so a cell
    that ends with a claim shows only that line).

    The claim holds when ``got == expected`` or, with ``rel_tol``/``abs_tol``, when the two
    numbers are that close. ``claim(statement, condition)`` checks a boolean; ``found`` then
    says what was measured (``found=f"gap {gap:.3f}"``). Prints ``✓ statement: found`` and
    raises :class:`ClaimFailed` (an AssertionError: the notebook fails) when it does not hold.
    """
    if rel_tol is not None or abs_tol is not None:
        holds = math.isclose(
            _float(got), _float(expected), rel_tol=rel_tol or 0.0, abs_tol=abs_tol or 0.0
        )
        tolerances = [f"{rel_tol:g} relative"] if rel_tol is not None else []
        tolerances += [f"{abs_tol:g} absolute"] if abs_tol is not None else []
        wanted = f"{_show(expected)} within {' and '.join(tolerances)}"
    else:
        result = got == expected
        if not isinstance(result, bool | np.bool_):
            raise TypeError(
                f"claim {statement!r}: got == expected gave {type(result).__name__}, not a "
                "bool; compare scalars, or pass a condition (claim(text, bool(...)))"
            )
        holds, wanted = bool(result), _show(expected)
    boolean = isinstance(got, bool | np.bool_) and expected is True
    shown = _show(found) if found is not None else ("" if boolean else _show(got))
    if not holds:
        detail = f"found {shown}" if shown else "it is false"
        raise ClaimFailed(f"✗ {statement}: {detail}" + ("" if boolean else f", expected {wanted}"))
    _CELL.passed(f"✓ {statement}" + (f": {shown}" if shown else ""), statement)


def claim_between(
    statement: str, got: float, low: float, high: float, *, found: object = None
) -> None:
    """Check that ``low <= got <= high``; print ``✓ statement: got (in [low, high])``."""
    shown = _show(found) if found is not None else _show(got)
    if not low <= got <= high:
        raise ClaimFailed(f"✗ {statement}: found {shown}, expected {_show(low)}..{_show(high)}")
    _CELL.passed(f"✓ {statement}: {shown} (expected {_show(low)}..{_show(high)})", statement)


@dataclasses.dataclass
class Caught:
    """The exception an :func:`expect_error` block raised (None until it has)."""

    error: BaseException | None = None

    @property
    def message(self) -> str:
        """``"Type: message"`` of the caught exception."""
        return "" if self.error is None else f"{type(self.error).__name__}: {self.error}"


@contextlib.contextmanager
def expect_error(
    *types: type[BaseException],
    match: str | None = None,
    shown: Callable[[str], str] | None = None,
) -> Iterator[Caught]:
    """Run a block that must raise one of ``types``; print the error the learner should read.

    A lesson shows an error without failing its notebook (papermill and nbval fail a run on
    any raised cell): the error is caught, printed as ``Type: message`` (or as
    ``shown(message)``, e.g. :func:`first_line` of a long one) and kept whole in the yielded
    :class:`Caught`. If nothing is raised, or the message does not match the regex ``match``,
    the block raises AssertionError: the lesson's claim no longer holds. Other exception
    types pass through unchanged.
    """
    expected = types or (Exception,)
    names = " or ".join(t.__name__ for t in expected)
    caught = Caught()
    try:
        yield caught
    except expected as exc:
        caught.error = exc
        print(caught.message if shown is None else shown(caught.message))
        if match is not None and not re.search(match, str(exc)):
            raise AssertionError(
                f"expected a {names} matching {match!r}, got: {caught.message}"
            ) from exc
        return
    raise AssertionError(f"expected a {names}, but the block raised nothing")


def first_line(message: str) -> str:
    """The first line of ``message`` (an error whose tail is a dump, for :func:`expect_error`)."""
    return message.splitlines()[0] if message else message
