"""``labkit inspect FILE.py[:NAME] [--mesh data=4] [--flags "..."] [--json] [--check] [...]``.

Compiles the function ``NAME`` of ``FILE.py`` (default ``step``) with the file's example
arguments for 8 H100s, without a GPU, and prints the report (:mod:`labkit.xla.inspect` has
the file convention, :mod:`labkit.xla.inspect_report` the report and its JSON schema).
``--timeline OUT`` also writes the step as a timeline (:mod:`labkit.xla.timeline`: modelled,
not measured), by the kit's model and, where the compile gave it, by XLA's own estimate on
the same time axis: ``OUT.json`` or ``OUT.json.gz`` a trace-event file for the Perfetto UI
(one process per model), ``OUT.svg`` the picture; one line on stderr says where it went and
what it shows.
A program larger than the GPU's memory gets "does not fit on an H100 SXM (80 GB): needs N GB
per GPU" on stderr first; what XLA logged while compiling comes after the report.
Exit codes: 0 a report (with ``--check``: 1 when it does not fit); 1 the program failed (its
import, its tracing, XLA's compile); 2 a usage problem (no such file, no such function, a bad
``--mesh`` or the file's ``MESH``, a mesh over one 8-GPU host, a flag ``labkit flags check``
refuses).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from labkit.cli.usage import UsageError
from labkit.core.types import CompilerOptions

if TYPE_CHECKING:
    from labkit.xla.xla_estimate import XlaEstimate

HELP = "inspect FILE.py[:NAME]: your program compiled for H100s"
USAGE = (
    'labkit inspect FILE.py[:NAME] [--mesh data=4,model=2] [--flags "--xla_..."] [--json] '
    "[--check] [--timeline OUT.json|OUT.svg]"
)
TIMELINE_SUFFIXES = (".json", ".json.gz", ".svg")
CONVENTION = (
    "FILE.py defines the function NAME (default: step) and example_args(mesh) (or "
    "NAME_args(mesh)) returning a tuple of its positional arguments: arrays or "
    "jax.ShapeDtypeStructs, sharded with PartitionSpecs (ShapeDtypeStruct(shape, dtype, "
    "sharding=P('data'))); optionally MESH = 'data=8', the mesh used without --mesh."
)


def parser() -> argparse.ArgumentParser:
    """The argument parser of ``labkit inspect``."""
    top = argparse.ArgumentParser(
        prog="labkit inspect",
        usage=USAGE,
        description="Compile your own function for H100s without a GPU and report on the "
        "program XLA builds: collectives and their overlap, GEMMs, kernels, memory, FLOPs, a "
        "the kit's model of the step (a range) with XLA's own estimate beside it, and what to "
        "try. " + CONVENTION,
    )
    top.add_argument("program", nargs="?", help="FILE.py or FILE.py:NAME")
    top.add_argument("--mesh", help="mesh axes as NAME=SIZE pairs, e.g. data=4,model=2")
    top.add_argument(
        "--flags",
        default="",
        help='XLA flags, e.g. "--xla_gpu_all_reduce_combine_threshold_bytes=0"',
    )
    top.add_argument("--json", action="store_true", help="print the report as JSON")
    top.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when the program does not fit in the GPU's memory",
    )
    top.add_argument(
        "--timeline",
        metavar="OUT",
        help="also write the step as a modelled timeline: OUT.json (or .json.gz) a Chrome / "
        "Perfetto trace-event file, OUT.svg a picture",
    )
    top.add_argument("--schema", action="store_true", help="print the JSON schema and exit")
    return top


def _failed(message: str) -> int:
    """The program failed (its import, its tracing, XLA's compile): say so, exit code 1."""
    print(f"error: {message}", file=sys.stderr)
    return 1


def main(argv: Sequence[str]) -> int:
    """Run ``labkit inspect``: 0 a report, 1 the program failed (a usage problem: UsageError)."""
    argv = list(argv)
    if "--flags" in argv[:-1]:  # `--flags --xla_...`: argparse would take the value for an option
        at = argv.index("--flags")
        argv[at : at + 2] = [f"--flags={argv[at + 1]}"]
    args = parser().parse_args(argv)
    if args.schema:
        from labkit.xla.inspect_schema import SCHEMA

        print(json.dumps(SCHEMA, indent=2))
        return 0
    if not args.program:
        raise UsageError(f"name a program file: {USAGE}\n{CONVENTION}")
    if args.timeline and not args.timeline.endswith(TIMELINE_SUFFIXES):
        raise UsageError(
            f"--timeline {args.timeline}: name a file ending in {', '.join(TIMELINE_SUFFIXES)} "
            "(a trace-event file for Perfetto, or a picture)"
        )
    from labkit.core import env

    try:
        env.setup(cpu_devices=8, mode="cpu")  # H100 programs compile on the CPU, GPU or not
    except env.SetupError as exc:
        raise UsageError(str(exc)) from None
    from labkit.gpt.compile import same_program_options
    from labkit.xla import inspect as inspection

    try:
        mesh = inspection.mesh_axes(args.mesh) if args.mesh else None
        flags = checked_flags(args.flags) if args.flags.strip() else {}
    except ValueError as exc:  # FlagError is one too
        raise UsageError(str(exc)) from None
    try:
        path, name = inspection.split_spec(args.program)
    except inspection.ProgramFileError as exc:
        raise UsageError(f"{exc}\n{CONVENTION}") from None
    try:
        inspection.load_program(path)
    except inspection.ProgramFileError as exc:
        raise UsageError(f"{exc}\n{CONVENTION}") from None
    except Exception as exc:  # the file's own code raised while importing
        return _failed(f"importing {path} failed: {type(exc).__name__}: {exc}")
    try:
        with xla_log() as xla_lines:  # XLA's own C++ log lines: shown after the verdict
            report = inspection.inspect_file(
                args.program,
                mesh=mesh,
                compiler_options=flags,
                same_program_options=same_program_options(),
            )
    except inspection.ProgramFileError as exc:
        raise UsageError(f"{exc}\n{CONVENTION}") from None
    except inspection.MeshError as exc:  # --mesh too large for one host
        raise UsageError(f"--mesh {args.mesh}: {exc}") from None
    except inspection.CompileError as exc:
        return _failed(str(exc))
    except Exception as exc:  # tracing or lowering the user's function failed
        lines = [line for line in str(exc).splitlines() if line.strip()][:6]
        return _failed(
            f"{path.name}:{name} did not trace or lower: {type(exc).__name__}: "
            + "\n".join(lines)
            + f"\nWhat to check: {inspection.TRACE_CHECK}"
        )
    from labkit.xla.inspect_report import does_not_fit

    if too_big := does_not_fit(report):
        print(f"{report.program.name}: {too_big}", file=sys.stderr)
    print(report.to_json() if args.json else report.to_text(), end="" if not args.json else "\n")
    if xla_lines:
        said = "\n".join(f"  {line}" for line in xla_lines)
        print(f"written to stderr while compiling (XLA's log, warnings):\n{said}", file=sys.stderr)
    if args.timeline:
        line = write_timeline(report.hlo, args.timeline, report.program.name, report.xla)
        print(line, file=sys.stderr)
    return 1 if args.check and too_big else 0


@contextlib.contextmanager
def xla_log() -> Iterator[list[str]]:
    """Collect what is written to file descriptor 2 (XLA's C++ log) inside the block; the
    lines are in the list once it ends (and printed at once if the block raises)."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield lines
        except BaseException:
            os.dup2(saved, 2)
            caught.seek(0)
            sys.stderr.write(caught.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines += caught.read().decode(errors="replace").splitlines()


def checked_flags(text: str) -> CompilerOptions:
    """``--flags`` as compiler options, once ``labkit flags check`` accepts every one.

    The same parser and verdicts as the flag check: a flag without a value it needs, an
    unknown flag or a removed one is a usage error showing the check's table.
    """
    from labkit.xla.flag_registry import compile_options
    from labkit.xla.flags import ProbeError, table, validate

    try:
        verdicts = validate(text)
    except ProbeError as exc:
        raise UsageError(f"--flags could not be checked: {exc}") from None
    if bad := [v for v in verdicts if v.would_abort]:
        raise UsageError(
            f"--flags: {len(bad)} of {len(verdicts)} flags are refused by this XLA "
            f"(as `labkit flags check` says):\n{table(verdicts)}\n"
            "Fix them (`labkit flags describe NAME` says what a flag takes), then run again."
        )
    return compile_options(text)


def write_timeline(hlo: str, out: str, title: str, xla: XlaEstimate | None = None) -> str:
    """Write the program's modelled timelines to ``out`` (trace JSON or SVG): the kit's model,
    and XLA's estimate when ``xla`` is given; says what it wrote."""
    from pathlib import Path

    from labkit.xla import timeline, trace_events
    from labkit.xla.xla_estimate import XlaModel

    steps = [timeline.build(hlo, title=title)]
    if xla is not None:
        steps.append(timeline.build(hlo, XlaModel(hlo, xla), title=f"{title}, XLA's model"))
    path = Path(out)
    if out.endswith(".svg"):
        timeline.picture(*steps).save(str(path))
        what = "picture"
    else:
        trace_events.write(path, *steps)
        what = "trace (open it in the Perfetto UI)"
    return f"timeline {what} written to {path}: " + "; ".join(s.caption() for s in steps)
