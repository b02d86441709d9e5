"""``labkit outputs [NOTEBOOKS...]`` (``make outputs``): store the checked cells' outputs.

Each notebook runs headless (:mod:`labkit.runner.preflight`) into ``build/outputs/``; the
outputs of its ``# NBVAL_CHECK_OUTPUT`` cells are copied back into the notebook, and every
other output is stripped, so a notebook stores only what nbval checks.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from labkit.cli.inputs import add_timeout, named_notebooks
from labkit.runner import preflight

HELP = "store outputs of NBVAL_CHECK_OUTPUT cells"


def parser() -> argparse.ArgumentParser:
    """The argument parser of ``labkit outputs``."""
    top = argparse.ArgumentParser(prog="labkit outputs")
    top.add_argument("notebooks", nargs="*", help="default: every notebook")
    add_timeout(top)
    return top


def main(argv: Sequence[str]) -> int:
    """Run each notebook and keep its checked outputs: 0, or 1 at the first that fails."""
    args = parser().parse_args(argv)
    for path in named_notebooks(args.notebooks):
        executed = Path("build") / "outputs" / path.name
        with preflight.scratch_space():  # its temporary files go with it
            result = preflight.execute(path, executed, timeout_s=args.timeout)
        if result.status != "ok":
            print(f"error: {result.notebook} failed: {result.error}", file=sys.stderr)
            return 1
        kept = preflight.keep_checked_outputs(executed, path)
        print(f"{result.notebook}: kept the outputs of {kept} checked cell(s)")
    return 0
