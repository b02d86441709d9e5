"""Command line: ``python -m labkit doctor | flags check [FLAGS...] | run | outputs``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def _doctor(cpu_devices: int) -> int:
    from labkit.core import env

    try:
        env.setup(cpu_devices=cpu_devices)
    except env.SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(env.report())
    if env.nvidia_gpu_present():
        return 0
    from labkit.xla import aot

    try:
        seconds = aot.self_test()
    except aot.AotUnavailable as exc:
        print(f"h100 test compile: FAILED: {exc}")
        return 1
    print(f"h100 test compile: ok ({seconds:.1f} s, compiled for an H100, not run)")
    return 0


def _notebooks(paths: Sequence[str]) -> list[Path] | None:
    """The notebooks named (default: all, found by glob), or None after reporting missing ones."""
    from labkit.cli import preflight

    chosen = [Path(p).resolve() for p in paths] or preflight.notebooks()
    missing = [str(p) for p in chosen if not p.exists()]
    if missing:
        print(f"error: no such notebook: {', '.join(missing)}", file=sys.stderr)
        return None
    return chosen


def _run(paths: Sequence[str], out: str, timeout_s: int, parameters: Sequence[str]) -> int:
    from labkit.cli import preflight

    chosen = _notebooks(paths)
    if chosen is None:
        return 2
    params: dict[str, object] = {}
    for item in parameters:
        name, sep, value = item.partition("=")
        if not sep:
            print(f"error: parameter {item!r} must look like NAME=VALUE", file=sys.stderr)
            return 2
        params[name] = _literal(value)
    results = preflight.run_all(chosen, Path(out), params, timeout_s)
    print(f"report: {Path(out) / 'report.md'}")
    return 0 if all(r.status == "ok" for r in results) else 1


def _outputs(paths: Sequence[str], timeout_s: int) -> int:
    from labkit.cli import preflight

    chosen = _notebooks(paths)
    if chosen is None:
        return 2
    for path in chosen:
        executed = Path("build") / "outputs" / path.name
        result = preflight.execute(path, executed, timeout_s=timeout_s)
        if result.status != "ok":
            print(f"error: {result.notebook} failed: {result.error}", file=sys.stderr)
            return 1
        kept = preflight.keep_checked_outputs(executed, path)
        print(f"{result.notebook}: kept the outputs of {kept} checked cell(s)")
    return 0


def _literal(text: str) -> object:
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m labkit``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["flags"]:
        from labkit.xla import flags

        return flags.cli(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m labkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="print the environment report")
    doctor.add_argument("--cpu-devices", type=int, default=8)
    sub.add_parser("flags", help="check XLA flags: flags check [FLAGS...]")
    run = sub.add_parser("run", help="execute notebooks headless and write a report")
    run.add_argument("notebooks", nargs="*", help="default: every notebook, solutions too")
    run.add_argument("--out", default="build", help="report folder (default: build)")
    run.add_argument("--timeout", type=int, default=240, help="seconds per notebook")
    run.add_argument("-p", "--parameter", action="append", default=[], metavar="NAME=VALUE")
    outputs = sub.add_parser("outputs", help="store outputs of NBVAL_CHECK_OUTPUT cells")
    outputs.add_argument("notebooks", nargs="*", help="default: every notebook")
    outputs.add_argument("--timeout", type=int, default=240, help="seconds per notebook")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return _doctor(args.cpu_devices)
    if args.command == "outputs":
        return _outputs(args.notebooks, args.timeout)
    return _run(args.notebooks, args.out, args.timeout, args.parameter)
