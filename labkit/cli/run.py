"""``labkit run [NOTEBOOKS...] [-p NAME VALUE] [-y YAML] [--out DIR] [--timeout SECONDS]``.

The instructor's preflight (``make run``): every notebook named (default: all) runs headless
with the plain papermill CLI (:mod:`labkit.runner.preflight`) into ``OUT/executed/``, and
``OUT/report.md`` and ``OUT/report.json`` list each one's status, time and key figures.
Everything a run is given is checked before the first notebook starts.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from labkit.cli.inputs import add_timeout, named_notebooks, out_problem
from labkit.cli.usage import UsageError
from labkit.runner import preflight

HELP = "execute notebooks headless and write a report"


def parser() -> argparse.ArgumentParser:
    """The argument parser of ``labkit run``."""
    top = argparse.ArgumentParser(prog="labkit run")
    top.add_argument("notebooks", nargs="*", help="default: every notebook, solutions too")
    top.add_argument(
        "--out",
        default="build",
        help="report folder, executed notebooks in OUT/executed/ (default: build)",
    )
    add_timeout(top)
    top.add_argument(
        "-p",
        "--parameter",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="as papermill's -p: only ints, floats, True/False/None are converted, "
        'so give lists and dicts with -y, e.g. -y "SIZES: [1024, 4096]"',
    )
    top.add_argument(
        "-y", "--yaml", action="append", default=[], help="as papermill's -y: a YAML mapping"
    )
    return top


def papermill_args(
    parameters: Sequence[Sequence[str]], yaml_texts: Sequence[str], notebooks: Sequence[Path]
) -> list[str]:
    """The ``-p NAME VALUE`` / ``-y YAML`` arguments for papermill.

    Values pass to the papermill CLI unchanged, so papermill's own rules apply: ``-p`` turns
    only ints, floats, True, False and None into Python values (``"[1, 2]"`` stays a string);
    lists and dicts go in ``-y``. Each name must be a parameter of every notebook run, and
    each value must suit it (:func:`labkit.cli.parameters.problem`); else :class:`UsageError`.
    An old name of a renamed parameter (:data:`labkit.cli.parameters.RENAMED`) is passed as
    its new name, with a note on stderr.
    """
    import yaml

    from labkit.cli.parameters import check, papermill_value

    given: list[tuple[str, object, str]] = []
    args: list[str] = []
    for text in yaml_texts:  # papermill applies -y first, then -p
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UsageError(f"-y {text!r} is not YAML: {str(exc).splitlines()[0]}") from None
        if not isinstance(loaded, dict):
            raise UsageError(f"-y takes a YAML mapping such as 'SIZES: [1024, 4096]', got {text!r}")
        named = {_current(str(k), notebooks): v for k, v in loaded.items()}
        given += [(k, v, f"-y {text!r}") for k, v in named.items()]
        if list(named) != [str(k) for k in loaded]:  # an old name: the new one goes to papermill
            text = yaml.safe_dump(named, default_flow_style=True, sort_keys=False).strip()
        args += ["-y", text]
    for name, value in parameters:
        if "=" in name:
            raise UsageError(_name_equals_value(name))
        how, name = f"-p {name} {value}", _current(name, notebooks)
        given.append((name, papermill_value(value), how))
        args += ["-p", name, value]
    if problem := check(notebooks, given):
        raise UsageError(problem)
    return args


def _name_equals_value(name: str) -> str:
    """What to say about ``-p NAME=VALUE``."""
    return f"-p takes NAME VALUE (papermill's syntax), got {name!r}: write -p NAME VALUE"


def _current(name: str, notebooks: Sequence[Path]) -> str:
    """``name``, or the new name of a renamed parameter (with a one-line note on stderr)."""
    from labkit.cli.parameters import new_name

    if (new := new_name(name, notebooks)) is None:
        return name
    print(
        f"note: the parameter {name} is called {new} now; labkit run passes {name} as {new} "
        "until the next release (plain papermill does not)",
        file=sys.stderr,
    )
    return new


def check_environment() -> None:
    """Refuse a run whose kernels could not start: ``$JAX_PLATFORMS`` and ``$XLA_FLAGS`` are
    checked as ``setup()`` checks them (:class:`UsageError` with the fix)."""
    from labkit.core import env

    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms and (problem := env.platforms_problem(platforms, env.nvidia_gpu_present())):
        raise UsageError(problem)
    if problem := env.xla_flags_problem(os.environ.get("XLA_FLAGS", "")):
        raise UsageError(f"{problem}\nFix or unset XLA_FLAGS, then run again.")


def main(argv: Sequence[str]) -> int:
    """Run the notebooks and write the report: 0 when every one ran, 1 when one failed."""
    for at, arg in enumerate(argv[:-1]):  # -p NAME=VALUE with no VALUE after it (last)
        after = argv[at + 2] if at + 2 < len(argv) else "-"
        if arg in ("-p", "--parameter") and "=" in argv[at + 1] and after.startswith("-"):
            raise UsageError(_name_equals_value(argv[at + 1]))
    args = parser().parse_args(argv)
    chosen = named_notebooks(args.notebooks)
    extra = papermill_args(args.parameter, args.yaml, chosen)
    check_environment()
    out = Path(args.out)
    if problem := out_problem(out):
        raise UsageError(problem)
    try:
        results = preflight.run_all(chosen, out, None, args.timeout, papermill_args=extra)
    except preflight.Busy as exc:
        raise UsageError(str(exc)) from None
    print(f"executed notebooks: {out / 'executed'}/  report: {out / 'report.md'}")
    return 0 if all(r.status == "ok" for r in results) else 1
