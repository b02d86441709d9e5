"""The ``labkit`` command: ``labkit doctor | kernel | flags | room | inspect | run | outputs |
gpu-check``.

Installed by ``make setup`` as ``.venv/bin/labkit``; ``.venv/bin/python -m labkit`` is the same
command. Run with a Python that lacks the lab's packages, it says how to get them.

Each command is one module of this package (:func:`commands`, the dispatch table): its
``HELP`` is its line in ``labkit --help``, its ``main(argv)`` parses its own arguments and
returns the exit code. A command refuses what it cannot use by raising
:class:`labkit.cli.usage.UsageError`: ``labkit`` prints ``error: MESSAGE`` and exits 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from typing import Protocol

from labkit.cli.usage import UsageError

# What every command needs; the runner's packages only for the commands that run notebooks.
REQUIRED = ("jax", "jaxlib", "flax", "optax", "numpy")
RUNNER = ("papermill", "nbformat", "yaml")
RUNS_NOTEBOOKS = ("run", "outputs", "gpu-check")
FIX = (
    "Use the lab's own environment: in the kit's folder run `make setup` once (it builds "
    ".venv with Python >= 3.12 and the pinned packages), then `.venv/bin/labkit {command}` "
    "or `make doctor`. Or, in a Python >= 3.12 of your own: "
    '`pip install -c constraints.txt -e ".[lessons]"` there, then `labkit {command}`.'
)


def environment_problem(command: str = "doctor", modules: Sequence[str] = REQUIRED) -> str | None:
    """Why this Python cannot run the lab (and the fix), or None when it can."""
    here = f"{sys.executable} (Python {sys.version.split()[0]})"
    if sys.version_info < (3, 12):  # noqa: UP036 (this guard is for older Pythons)
        return f"{here} is too old: the lab needs Python >= 3.12. " + FIX.format(command=command)
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        return f"{here} lacks {', '.join(missing)}. " + FIX.format(command=command)
    return None


class Command(Protocol):
    """A command's module: its line of help and its entry point."""

    HELP: str

    def main(self, argv: Sequence[str]) -> int:
        """Parse ``argv`` (the arguments after the command's name) and run; the exit code."""
        ...


def commands() -> dict[str, Command]:
    """The dispatch table: each command's module by name, in ``labkit --help``'s order."""
    # Imported here, after main's check that this Python has the lab's packages.
    from labkit.cli import doctor, flags, gpu_check, inspect, kernel, outputs, room, run

    return {
        "doctor": doctor,
        "kernel": kernel,
        "flags": flags,
        "room": room,
        "inspect": inspect,
        "run": run,
        "outputs": outputs,
        "gpu-check": gpu_check,
    }


def parser(table: dict[str, Command]) -> argparse.ArgumentParser:
    """``labkit [-h] COMMAND ...``: chooses the command; the command parses the rest."""
    about = "The OpenXLA GPU Lab Kit's command (make doctor and make run call it)."
    top = argparse.ArgumentParser(prog="labkit", description=about)
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in table.items():
        sub.add_parser(name, help=command.HELP, add_help=False)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``labkit`` command and of ``python -m labkit``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name = argv[0] if argv and not argv[0].startswith("-") else "doctor"
    needs = REQUIRED + (RUNNER if name in RUNS_NOTEBOOKS else ())
    if problem := environment_problem(name, needs):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    table = commands()
    command = table[parser(table).parse_args(argv[:1]).command]
    try:
        return command.main(argv[1:])
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
