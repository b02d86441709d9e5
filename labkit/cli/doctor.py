"""``labkit doctor``: the environment report, a test compile for an H100, and $XLA_FLAGS checked."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

HELP = "print the environment report"


def clean_xla_flags() -> int:
    """Check $XLA_FLAGS in subprocesses; drop the flags that would abort JAX. Returns #dropped."""
    text = os.environ.get("XLA_FLAGS", "").strip()
    if not text:
        return 0
    from labkit.core.report import markdown_table
    from labkit.xla import flags

    try:
        verdicts = flags.validate(text)
    except (ValueError, flags.ProbeError) as exc:
        print(f"XLA_FLAGS: {exc}")
        print("doctor goes on with XLA_FLAGS cleared (your shell still has them: fix or unset).")
        os.environ.pop("XLA_FLAGS")
        return 1
    bad = [v for v in verdicts if v.would_abort]
    if not bad:
        print(f"XLA_FLAGS: all {len(verdicts)} flags accepted by this jaxlib.")
        return 0
    rows = [{"flag": v.token, "verdict": v.status, "note": v.message} for v in bad]
    print(f"XLA_FLAGS: {len(bad)} of {len(verdicts)} flags would abort JAX:")
    print(markdown_table(rows, ["flag", "verdict", "note"]))
    kept = [
        f'--{v.name}="{v.value}"' if re.search(r"\s", v.value) else v.token
        for v in verdicts
        if not v.would_abort
    ]
    os.environ["XLA_FLAGS"] = " ".join(kept)
    print(f"doctor goes on with XLA_FLAGS={' '.join(kept)!r} (the bad flags removed; fix them).\n")
    return len(bad)


def cpu_devices(text: str) -> int:
    """``--cpu-devices``: a number of virtual CPU devices that setup() accepts."""
    from labkit.core.env import cpu_devices_problem

    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give a whole number such as 8, got {text!r}") from None
    if problem := cpu_devices_problem(count):
        raise argparse.ArgumentTypeError(problem)
    return count


def parser() -> argparse.ArgumentParser:
    """The argument parser of ``labkit doctor``."""
    top = argparse.ArgumentParser(prog="labkit doctor")
    top.add_argument("--cpu-devices", type=cpu_devices, default=8, help="CPU mode devices (8)")
    top.add_argument("--mode", choices=("auto", "cpu", "gpu"), default="auto")
    return top


def main(argv: Sequence[str]) -> int:
    """Print the report; 1 when the H100 test compile fails or $XLA_FLAGS would abort JAX."""
    args = parser().parse_args(argv)
    from labkit.core import env

    dropped = clean_xla_flags()
    try:
        chosen = env.setup(cpu_devices=args.cpu_devices, mode=args.mode)
    except env.SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(env.report())
    status = 0
    if chosen.mode == "gpu":
        print(f"gpu mode: {chosen.num_devices} GPU(s)")
    else:
        from labkit.xla import aot

        try:
            seconds = aot.self_test()
            print(f"h100 test compile: ok ({seconds:.1f} s, compiled for an H100, not run)")
        except aot.AotUnavailable as exc:
            print(f"h100 test compile: FAILED: {exc}")
            status = 1
    if dropped:
        print("\nXLA_FLAGS in your environment would abort JAX: fix the flags listed above.")
        status = 1
    return status
