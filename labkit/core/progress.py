"""A learner's exercise progress: one small JSON file in their own folder, opt-in.

Every exercise verdict (:class:`labkit.core.feedback.Feedback`) is recorded here, but only
where the environment variable ``LABKIT_PROGRESS`` names the file: the room's hub sets it
for each learner's server (``make hub``); a learner on their own laptop writes nothing. The
file stays in the learner's folder; ``labkit room`` reads the room's files on the same
machine. No data leaves the machine.

The file: ``{"learner": NAME, "exercises": {"00.1": {"status": "passed", "attempts": 2,
"time": ISO-8601}}}`` with status ``passed``, ``not yet`` (answered, wrong) or ``to do``
(the checker ran on an unanswered exercise). A later verdict replaces an earlier one, except
that ``to do`` never replaces an answer.
"""

from __future__ import annotations

import datetime
import fcntl
import getpass
import json
import os
import warnings
from pathlib import Path
from typing import Literal, TypedDict

ENV_VAR = "LABKIT_PROGRESS"
FILE_NAME = ".labkit-progress.json"  # hidden in JupyterLab's file browser
WORK_DIR = "openxla-lab"  # the room's copy of the lessons, in each learner's home
LEARNERS_GROUP = "labkit-learners"  # the room's learners, as system users
type Status = Literal["passed", "not yet", "to do"]


class Verdict(TypedDict):
    """One exercise's entry in a progress file."""

    status: Status
    attempts: int  # answered verdicts so far ("to do" does not count)
    time: str  # ISO-8601, UTC, of the latest verdict


class Progress(TypedDict, total=False):
    """A progress file's content."""

    learner: str
    exercises: dict[str, Verdict]


def progress_path() -> Path | None:
    """The file progress is recorded in, or None when recording is off (the default)."""
    value = os.environ.get(ENV_VAR, "").strip()
    return Path(value).expanduser() if value else None


def status(passed: bool, attempted: bool) -> Status:
    """The recorded status of a verdict."""
    return "passed" if passed else ("not yet" if attempted else "to do")


def merge(record: Progress, exercise: str, verdict: Status, now: str) -> Progress:
    """``record`` with one verdict added (pure: the rules, without the file)."""
    exercises = dict(record.get("exercises", {}))
    old = exercises.get(exercise)
    if verdict == "to do" and old is not None:
        return record
    attempts = (old.get("attempts", 0) if old else 0) + (verdict != "to do")
    exercises[exercise] = {"status": verdict, "attempts": attempts, "time": now}
    return {**record, "exercises": exercises}


def record(exercise: str, passed: bool, attempted: bool, path: Path | None = None) -> None:
    """Record one verdict in the progress file, if recording is on; never fail a lesson.

    Several kernels of one learner may write at once: the read-modify-write holds an
    exclusive lock on the file. A file that cannot be written gives a warning, not an error.
    """
    path = path or progress_path()
    if path is None:
        return
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        with os.fdopen(fd, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            text = f.read()
            try:
                old: Progress = json.loads(text) if text.strip() else {}
            except json.JSONDecodeError:
                old = {}
            new = merge(old, exercise, status(passed, attempted), now)
            new.setdefault("learner", getpass.getuser())
            if new is not old:
                f.seek(0)
                f.truncate()
                f.write(json.dumps(new, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        warnings.warn(
            f"exercise progress not recorded in {path} ({exc}); unset {ENV_VAR} to stop "
            "recording, or make the folder writable",
            stacklevel=2,
        )


def load(path: Path) -> Progress:
    """A progress file's content; a missing or unreadable file reads as no progress."""
    try:
        data: Progress = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}  # a JSON list or number: no progress
