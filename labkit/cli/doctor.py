"""``labkit doctor``: the environment report, the versions of jax, jaxlib and the CUDA plugin
compared with the calibrated ones and with each other, a test compile for an H100, and
$XLA_FLAGS checked."""

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


def version_lines(
    versions: dict[str, str | None] | None = None,
) -> tuple[list[str], list[str]]:
    """doctor's lines on jax, jaxlib and the CUDA plugin, and the problems among them: versions
    that cannot work together (a CUDA plugin jaxlib refuses, a kernel still running an older
    jax) are problems; versions other than the calibrated ones are a note of what to expect."""
    from labkit.core import env

    found = env.installed_versions() if versions is None else versions
    here = {name: v for name, v in found.items() if v is not None}
    problems = env.version_problems(found)
    if versions is None and (stale := env.stale_import_problem()):
        problems.insert(0, stale)
    lines = ["versions: " + ", ".join(f"{name} {v}" for name, v in here.items())]
    lines += [f"versions: PROBLEM: {problem}" for problem in problems]
    if (difference := env.version_difference(found)) is None:
        lines.append(f"versions: the ones the lessons are calibrated to ({env.CALIBRATED})")
    else:
        calibrated = " ".join(f'"{name}=={env.CALIBRATED}"' for name in here)
        lines.append(f"versions: {difference}: some claims may fail, and a failed claim says so")
        lines.append(f"versions: the calibrated ones: pip install {calibrated}")
    return lines, problems


def parser() -> argparse.ArgumentParser:
    """The argument parser of ``labkit doctor``."""
    top = argparse.ArgumentParser(prog="labkit doctor")
    top.add_argument("--cpu-devices", type=cpu_devices, default=8, help="CPU mode devices (8)")
    top.add_argument("--mode", choices=("auto", "cpu", "gpu"), default="auto")
    return top


def main(argv: Sequence[str]) -> int:
    """Print the report; 1 when the H100 test compile fails or cannot run, the CUDA plugin does
    not match jaxlib, or $XLA_FLAGS would abort JAX."""
    args = parser().parse_args(argv)
    from labkit.core import env

    dropped = clean_xla_flags()
    try:
        chosen = env.setup(cpu_devices=args.cpu_devices, mode=args.mode, notes=False)
    except env.SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(env.report())
    lines, problems = version_lines()
    print("\n".join(lines))
    status = 1 if problems else 0
    if chosen.mode == "gpu":
        print(f"gpu mode: {chosen.num_devices} GPU(s)")
    elif (problem := env.h100_compile_problem()) is not None:
        said = "the CUDA plugin does not match jaxlib (above)" if problems else problem
        print(f"h100 test compile: not run: {said}")
        status = 1
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
