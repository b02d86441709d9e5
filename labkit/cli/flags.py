"""``labkit flags check [FLAGS...] | describe NAME...``: XLA flags checked in subprocesses."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence

from labkit.core.report import markdown_table
from labkit.xla.flags import ProbeError, describe, validate

HELP = "check XLA flags: flags check [FLAGS...] | describe NAME..."


def main(argv: Sequence[str]) -> int:
    """``flags check [FLAGS...]`` (default $XLA_FLAGS) or ``flags describe NAME...``."""
    usage = "usage: labkit flags check [FLAGS...] (default: $XLA_FLAGS) | describe NAME..."
    command, *rest = ["--help"] if {"-h", "--help"} & {*argv} else [*argv] or [""]
    if command not in ("check", "describe") or (command == "describe" and not rest):
        print(usage, file=sys.stdout if command in ("-h", "--help") else sys.stderr)
        return 0 if command in ("-h", "--help") else 2
    try:
        if command == "describe":
            print("\n\n".join(describe(name) for name in rest))
            return 0
        text = " ".join(shlex.quote(t) for arg in rest for t in shlex.split(arg))
        text = text if rest else os.environ.get("XLA_FLAGS", "")
        if not text.strip():
            empty = "the flags given are empty" if rest else "XLA_FLAGS is empty"
            print(f"{empty}: nothing to check (JAX starts with XLA's defaults).")
            return 0
        verdicts = validate(text)
    except (ValueError, ProbeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    rows = [{"flag": v.token, "verdict": v.status, "note": v.message} for v in verdicts]
    print(markdown_table(rows, ["flag", "verdict", "note"]))
    bad = sum(v.would_abort for v in verdicts)
    print(f"\n{bad} of {len(verdicts)} flags would abort JAX." if bad else "\nall flags accepted.")
    return 1 if bad else 0
