"""``labkit room``: the instructor's view of the room, learners x exercises.

Reads each learner's progress file (:mod:`labkit.core.progress`) on this machine: by
default those of the room's learners (members of the system group ``labkit-learners`` that
``make hub`` creates, so run it as root: their homes are private), or the files and folders
named on the command line. Marks: ``✓`` passed, ``✗`` answered but not yet right, ``·``
checker run on an unanswered exercise, blank: not reached.
"""

from __future__ import annotations

import argparse
import grp
import pwd
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from labkit.cli.usage import UsageError
from labkit.core.progress import FILE_NAME, LEARNERS_GROUP, WORK_DIR, Progress, load

HELP = "the room (make hub): learners x exercises from their progress"
MARKS = {"passed": "✓", "not yet": "✗", "to do": "·"}


def group_exists(group: str) -> bool:
    """Whether the system group ``group`` exists (``make hub`` creates the learners' one)."""
    try:
        grp.getgrnam(group)
    except KeyError:
        return False
    return True


def learner_files(group: str = LEARNERS_GROUP) -> list[tuple[str, Path]]:
    """(name, progress file) of each member of ``group``, whether the file exists yet or not."""
    try:
        entry = grp.getgrnam(group)
    except KeyError:
        return []
    members = [u for u in pwd.getpwall() if u.pw_gid == entry.gr_gid or u.pw_name in entry.gr_mem]
    return [(u.pw_name, Path(u.pw_dir) / WORK_DIR / FILE_NAME) for u in members]


def find_files(paths: Sequence[Path]) -> list[tuple[str, Path]]:
    """(name, progress file) of the files named, or found under the folders named.

    The name is the folder above the learner's lesson folder (their home), else the file's
    own folder; a file's ``learner`` field, when present, wins.
    """
    found = []
    for path in paths:
        for file in sorted(path.rglob(FILE_NAME)) if path.is_dir() else [path]:
            folder = file.parent
            found.append((folder.parent.name if folder.name == WORK_DIR else folder.name, file))
    return found


def exercise_key(name: str) -> tuple[int | str, ...]:
    """Sort key: 00.2 before 00.10, 02 before 02b."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def table(records: Sequence[tuple[str, Progress]]) -> str:
    """A Markdown table: one row per learner, one column per exercise, and a count passed."""
    exercises = sorted({e for _, r in records for e in r.get("exercises", {})}, key=exercise_key)
    head = ["learner", *exercises, "passed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rec in records:
        done = rec.get("exercises", {})
        verdicts = [done.get(e) for e in exercises]
        marks = [MARKS.get(v.get("status", ""), "") if v is not None else "" for v in verdicts]
        passed = sum(m == MARKS["passed"] for m in marks)
        lines.append("| " + " | ".join([name, *marks, f"{passed}/{len(exercises)}"]) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    """Print the room's table; 1 when no learner's progress was found (a bad path: UsageError)."""
    parser = argparse.ArgumentParser(
        prog="labkit room", description="Learners x exercises, from their progress files."
    )
    parser.add_argument(
        "paths",
        nargs="*",
        type=Path,
        help=f"progress files or folders to search for {FILE_NAME} (default: the homes of "
        f"group {LEARNERS_GROUP}'s members)",
    )
    parser.add_argument("--group", default=LEARNERS_GROUP, help="the learners' system group")
    args = parser.parse_args(argv)
    if missing := [str(p) for p in args.paths if not p.exists()]:
        raise UsageError(f"no such file or folder: {', '.join(missing)}")
    if not args.paths and not group_exists(args.group):
        print(
            f"group {args.group} does not exist yet: `make hub` (as root) creates it when the "
            "room starts, and learners join it as they sign up. Or name progress files or "
            "folders: labkit room PATH...",
            file=sys.stderr,
        )
        return 1
    files = find_files(args.paths) if args.paths else learner_files(args.group)
    if not files:
        where = ", ".join(map(str, args.paths)) or f"group {args.group} (no members yet)"
        print(f"no learners' progress found in {where}", file=sys.stderr)
        return 1
    records = []
    for name, path in sorted(files):
        try:
            path.open().close()
        except FileNotFoundError:
            pass  # no exercise checked yet: an empty row
        except PermissionError:
            print(f"cannot read {path}: run `labkit room` as root", file=sys.stderr)
        rec = load(path)
        records.append((str(rec.get("learner", name)), rec))
    print(table(records))
    return 0
