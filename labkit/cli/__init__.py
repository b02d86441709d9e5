"""The ``labkit`` command: ``labkit doctor | flags check [FLAGS...] | run | outputs | room``.

Installed by ``make setup`` as ``.venv/bin/labkit``; ``.venv/bin/python -m labkit`` is the same
command. Run with a Python that lacks the lab's packages, it says how to get them.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

# What every command needs; papermill only for ``run`` and ``outputs``.
REQUIRED = ("jax", "jaxlib", "flax", "optax", "numpy")
RUNNER = ("papermill", "nbformat", "yaml")
FIX = (
    "Use the lab's own environment: in the kit's folder run `make setup` once (it builds "
    ".venv with Python >= 3.12 and the pinned packages), then `.venv/bin/labkit {command}` "
    "or `make doctor`."
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


def _clean_xla_flags() -> int:
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


def _doctor(cpu_devices: int, mode: str) -> int:
    from labkit.core import env

    dropped = _clean_xla_flags()
    try:
        chosen = env.setup(cpu_devices=cpu_devices, mode=mode)  # type: ignore[arg-type]
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


def _notebooks(paths: Sequence[str]) -> list[Path] | None:
    """The notebooks named (default: all, found by glob; a folder: its notebooks), or None
    after reporting missing ones or files that are no runnable notebook."""
    from labkit.cli import inputs
    from labkit.runner import preflight

    named = [Path(p).resolve() for p in paths]
    missing = [str(p) for p in named if not p.exists()]
    if missing:
        try:
            known = ", ".join(str(p.relative_to(Path.cwd())) for p in preflight.notebooks())
        except (FileNotFoundError, ValueError):
            known = "none found from here"
        print(f"error: no such notebook: {', '.join(missing)}", file=sys.stderr)
        print(f"notebooks: {known}", file=sys.stderr)
        return None
    chosen = inputs.expand(named) if named else preflight.notebooks()
    for path in chosen or named:  # an empty folder is reported as such
        if problem := inputs.notebook_problem(path):
            print(f"error: {problem}", file=sys.stderr)
            return None
    return chosen


def papermill_args(
    parameters: Sequence[Sequence[str]], yaml_texts: Sequence[str], notebooks: Sequence[Path]
) -> list[str] | str:
    """The ``-p NAME VALUE`` / ``-y YAML`` arguments for papermill, or an error message.

    Values pass to the papermill CLI unchanged, so papermill's own rules apply: ``-p`` turns
    only ints, floats, True, False and None into Python values (``"[1, 2]"`` stays a string);
    lists and dicts go in ``-y``. Each name must be a parameter of every notebook run, and
    each value must suit it (:func:`labkit.cli.parameters.problem`).
    """
    import yaml

    from labkit.cli.parameters import check, papermill_value

    given: list[tuple[str, object, str]] = []
    args: list[str] = []
    for text in yaml_texts:  # papermill applies -y first, then -p
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            return f"-y {text!r} is not YAML: {str(exc).splitlines()[0]}"
        if not isinstance(loaded, dict):
            return f"-y takes a YAML mapping such as 'SIZES: [1024, 4096]', got {text!r}"
        given += [(str(k), v, f"-y {text!r}") for k, v in loaded.items()]
    for name, value in parameters:
        if "=" in name:
            return f"-p takes NAME VALUE (papermill's syntax), got {name!r}: write -p NAME VALUE"
        given.append((name, papermill_value(value), f"-p {name} {value}"))
        args += ["-p", name, value]
    args = [a for text in yaml_texts for a in ("-y", text)] + args
    return check(notebooks, given) or args


def _run_problem(args: argparse.Namespace, chosen: Sequence[Path]) -> str | list[str]:
    """What stops this run before it starts (one message), or papermill's extra arguments."""
    from labkit.cli import inputs
    from labkit.core import env

    extra = papermill_args(args.parameter, args.yaml, chosen)
    if isinstance(extra, str):
        return extra
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms and (problem := env.platforms_problem(platforms, env.nvidia_gpu_present())):
        return problem
    if problem := env.xla_flags_problem(os.environ.get("XLA_FLAGS", "")):
        return f"{problem}\nFix or unset XLA_FLAGS, then run again."
    return inputs.out_problem(Path(args.out)) or extra


def _run(args: argparse.Namespace) -> int:
    from labkit.runner import preflight

    chosen = _notebooks(args.notebooks)
    if chosen is None:
        return 2
    extra = _run_problem(args, chosen)
    if isinstance(extra, str):
        print(f"error: {extra}", file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        results = preflight.run_all(chosen, out, None, args.timeout, papermill_args=extra)
    except preflight.Busy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"executed notebooks: {out / 'executed'}/  report: {out / 'report.md'}")
    return 0 if all(r.status == "ok" for r in results) else 1


def _outputs(paths: Sequence[str], timeout_s: int) -> int:
    from labkit.runner import preflight

    chosen = _notebooks(paths)
    if chosen is None:
        return 2
    for path in chosen:
        executed = Path("build") / "outputs" / path.name
        with preflight.scratch_space():  # its temporary files go with it
            result = preflight.execute(path, executed, timeout_s=timeout_s)
        if result.status != "ok":
            print(f"error: {result.notebook} failed: {result.error}", file=sys.stderr)
            return 1
        kept = preflight.keep_checked_outputs(executed, path)
        print(f"{result.notebook}: kept the outputs of {kept} checked cell(s)")
    return 0


def _seconds(text: str) -> int:
    """``--timeout``: a positive whole number of seconds."""
    try:
        seconds = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"give whole seconds, e.g. --timeout 600; got {text!r}"
        ) from None
    if seconds < 1:
        raise argparse.ArgumentTypeError(
            f"must be at least 1 second (each notebook's time limit), got {seconds}"
        )
    return seconds


def _cpu_devices(text: str) -> int:
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
    """The argument parser of the ``labkit`` command."""
    from labkit.runner.preflight import DEFAULT_TIMEOUT_S

    about = "The OpenXLA GPU Lab Kit's command (make doctor and make run call it)."
    top = argparse.ArgumentParser(prog="labkit", description=about)
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    doctor = sub.add_parser("doctor", help="print the environment report")
    doctor.add_argument("--cpu-devices", type=_cpu_devices, default=8, help="CPU mode devices (8)")
    doctor.add_argument("--mode", choices=("auto", "cpu", "gpu"), default="auto")
    sub.add_parser("flags", help="check XLA flags: flags check [FLAGS...] | describe NAME...")
    sub.add_parser("room", help="the room (make hub): learners x exercises from their progress")
    sub.add_parser("inspect", help="inspect FILE.py[:NAME]: your program compiled for H100s")
    run = sub.add_parser("run", help="execute notebooks headless and write a report")
    run.add_argument("notebooks", nargs="*", help="default: every notebook, solutions too")
    run.add_argument(
        "--out",
        default="build",
        help="report folder, executed notebooks in OUT/executed/ (default: build)",
    )
    timeout = (
        f"seconds for each whole notebook (default {DEFAULT_TIMEOUT_S}); past it papermill "
        "and its kernel are stopped and the notebook counts as failed"
    )
    run.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT_S, help=timeout)
    run.add_argument(
        "-p",
        "--parameter",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="as papermill's -p: only ints, floats, True/False/None are converted, "
        'so give lists and dicts with -y, e.g. -y "SIZES: [1024, 4096]"',
    )
    run.add_argument(
        "-y", "--yaml", action="append", default=[], help="as papermill's -y: a YAML mapping"
    )
    outputs = sub.add_parser("outputs", help="store outputs of NBVAL_CHECK_OUTPUT cells")
    outputs.add_argument("notebooks", nargs="*", help="default: every notebook")
    outputs.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT_S, help=timeout)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``labkit`` command and of ``python -m labkit``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and not argv[0].startswith("-") else "doctor"
    needs = REQUIRED + (RUNNER if command in ("run", "outputs") else ())
    if problem := environment_problem(command, needs):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if argv[:1] == ["flags"]:
        from labkit.cli import flags

        return flags.main(argv[1:])
    if argv[:1] == ["room"]:
        from labkit.cli import room

        return room.main(argv[1:])
    if argv[:1] == ["inspect"]:
        from labkit.cli import inspect

        return inspect.main(argv[1:])
    args = parser().parse_args(argv)
    if args.command == "doctor":
        return _doctor(args.cpu_devices, args.mode)
    if args.command == "outputs":
        return _outputs(args.notebooks, args.timeout)
    return _run(args)
