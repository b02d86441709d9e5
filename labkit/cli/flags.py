"""``labkit flags check [--warn] [FLAGS...] | describe NAME...``: XLA flags, checked apart."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence

from labkit.xla.flags import ProbeError, describe, table, validate

HELP = "check XLA flags: flags check [FLAGS...] | describe NAME..."
# What `make lab` adds under the table when it starts with an XLA_FLAGS that would abort JAX.
LAB_WARNING = (
    "warning: XLA_FLAGS would abort JAX in every notebook. The lab's kernel starts without "
    "them and shows this table in the notebook; fix or unset XLA_FLAGS in this shell, then "
    "restart make lab to use flags."
)


def main(argv: Sequence[str]) -> int:
    """``flags check [FLAGS...]`` (default $XLA_FLAGS) or ``flags describe NAME...``.

    ``check --warn`` (what ``make lab`` runs) only warns: it exits 0 and writes the table and
    a warning to stderr when the flags would abort JAX, nothing when they would not.
    """
    usage = "usage: labkit flags check [--warn] [FLAGS...] (default: $XLA_FLAGS) | describe NAME..."
    command, *rest = ["--help"] if {"-h", "--help"} & {*argv} else [*argv] or [""]
    if command not in ("check", "describe") or (command == "describe" and not rest):
        print(usage, file=sys.stdout if command in ("-h", "--help") else sys.stderr)
        return 0 if command in ("-h", "--help") else 2
    warn = command == "check" and "--warn" in rest
    rest = [a for a in rest if a != "--warn"] if warn else rest
    out = sys.stderr if warn else sys.stdout
    try:
        if command == "describe":
            print("\n\n".join(describe(name) for name in rest))
            return 0
        text = " ".join(shlex.quote(t) for arg in rest for t in shlex.split(arg))
        text = text if rest else os.environ.get("XLA_FLAGS", "")
        if not text.strip():
            if not warn:
                empty = "the flags given are empty" if rest else "XLA_FLAGS is empty"
                print(f"{empty}: nothing to check (JAX starts with XLA's defaults).")
            return 0
        verdicts = validate(text)
    except (ValueError, ProbeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        if warn:
            print(LAB_WARNING, file=sys.stderr)
        return 0 if warn else 1
    bad = sum(v.would_abort for v in verdicts)
    if warn and not bad:
        return 0
    print(table(verdicts), file=out)
    print(
        f"\n{bad} of {len(verdicts)} flags would abort JAX." if bad else "\nall flags accepted.",
        file=out,
    )
    if warn:
        print(LAB_WARNING, file=sys.stderr)
        return 0
    return 1 if bad else 0
