"""``labkit kernel install``: the lab's Jupyter kernel spec, as ``make setup`` writes it.

``labkit kernel install [--name NAME] [PREFIX]`` writes PREFIX/share/jupyter/kernels/NAME
for this Python (PREFIX defaults to its environment, ``sys.prefix``). ``make setup`` runs it
(through ``tools/kernel-spec``) with the lab's Python; a learner who installed the kit with pip
runs it once in their own environment and gets the same quiet kernel. Its name stays python3,
so the kit's notebooks and a learner's own new notebook both start in it. ``make setup-torch``
writes ``--name labkit-torch`` with .venv-torch's Python into .venv: the kernel
02b_export_pytorch asks for, found there by JupyterLab, papermill and nbval. Both:

- start with ``python -m labkit.cli.kernel_start`` (ipykernel after a check of ``XLA_FLAGS``):
  flags that would abort JAX give the first cell the flag check's table, not a dead kernel;

- ``--IPKernelApp.log_level=ERROR`` hides ipykernel's "Kernel is running over TCP without
  encryption" warning (the kernel and Jupyter talk on 127.0.0.1);
- ``JAX_PLATFORMS=cpu`` (no GPU only) keeps the compile-only CUDA plugin from probing for a
  GPU and printing its "Unable to load cuDNN" traceback;
- ``TF_CPP_MIN_LOG_LEVEL=2`` hides XLA's C++ info and warning lines (timestamps and PIDs);
- ``PYDEVD_DISABLE_FILE_VALIDATION=1`` hides the debugger's frozen-modules note.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from labkit.cli.usage import UsageError

HELP = "install the lab's quiet Jupyter kernel (as make setup does)"

LAUNCHER = "labkit.cli.kernel_start"  # run with -m, in place of ipykernel_launcher
DISPLAY = {"python3": "Python 3 (OpenXLA lab)", "labkit-torch": "Python 3 (OpenXLA lab + PyTorch)"}


def spec_env(gpu: bool) -> dict[str, str]:
    """Environment variables of the lab's kernel (``JAX_PLATFORMS=cpu`` where there is no GPU)."""
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
    if not gpu:
        env["JAX_PLATFORMS"] = "cpu"
    return env


def install(name: str = "python3", prefix: Path | None = None, gpu: bool | None = None) -> Path:
    """Write the kernel spec ``name`` for this Python into ``prefix``; return its folder.

    ``prefix`` defaults to this Python's environment (``sys.prefix``); ``gpu`` to whether this
    machine has an NVIDIA GPU. An existing spec of that name in ``prefix`` is replaced.
    """
    if name not in DISPLAY:
        raise UsageError(f"kernel name must be one of {', '.join(sorted(DISPLAY))}, got {name!r}")
    if importlib.util.find_spec("ipykernel") is None:
        raise UsageError(
            f"ipykernel is not installed for {sys.executable}: install the kit's `lab` extra "
            '(pip install -c constraints.txt -e ".[lab]" in the kit\'s folder)'
        )
    from ipykernel.kernelspec import write_kernel_spec

    from labkit.core.env import nvidia_gpu_present

    target = Path(sys.prefix if prefix is None else prefix) / "share" / "jupyter" / "kernels" / name
    try:
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        overrides = {
            "display_name": DISPLAY[name],
            "env": spec_env(nvidia_gpu_present() if gpu is None else gpu),
        }
        write_kernel_spec(target, overrides, extra_arguments=["--IPKernelApp.log_level=ERROR"])
        spec_file = target / "kernel.json"
        spec = json.loads(spec_file.read_text())
        spec["argv"] = [LAUNCHER if a == "ipykernel_launcher" else a for a in spec["argv"]]
        spec_file.write_text(json.dumps(spec, indent=1))
    except PermissionError as exc:
        raise UsageError(
            f"cannot write {target} ({exc.strerror}): give a PREFIX you can write to, such as "
            "~/.local (Jupyter looks in ~/.local/share/jupyter/kernels)"
        ) from None
    return target


def parser() -> argparse.ArgumentParser:
    """The argument parser of ``labkit kernel``."""
    top = argparse.ArgumentParser(prog="labkit kernel", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = sub.add_parser("install", help="write the kernel spec for this Python")
    add.add_argument("--name", default="python3", choices=sorted(DISPLAY))
    add.add_argument("prefix", nargs="?", type=Path, help="environment to write into (sys.prefix)")
    return top


def main(argv: Sequence[str]) -> int:
    """Write the kernel spec; print where it went and what it sets."""
    args = parser().parse_args(argv)
    target = install(args.name, args.prefix)
    spec = json.loads((target / "kernel.json").read_text())
    said = " ".join(f"{k}={v}" for k, v in spec["env"].items())
    print(f"kernel spec: {target} ({spec['display_name']!r}, env: {said})")
    return 0
