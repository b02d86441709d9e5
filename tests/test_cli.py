"""The ``labkit`` command as a newcomer meets it: one form that works, clear messages, quiet
kernels, one copy of each lesson in JupyterLab."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import nbformat
import pytest
from notebook_files import code_notebook

from labkit.cli import commands, environment_problem, kernel_start, main
from labkit.cli import flags as flags_cli
from labkit.cli.parameters import RENAMED, new_name
from labkit.cli.parameters import defaults as parameter_defaults
from labkit.cli.run import papermill_args
from labkit.cli.usage import UsageError
from labkit.core import env
from labkit.runner import preflight

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _notebook(path: Path, cells: list[str], parameters: str | None = None) -> Path:
    code_notebook(cells, path, parameters)
    return path


def _env(**extra: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    return {**environ, **extra}


def _labkit(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "labkit"), *args],
        capture_output=True,
        text=True,
        env=_env(**extra_env),
        cwd=ROOT,
        timeout=300,
    )


# --------------------------------------------------------------------------------------
# One form of the command, and the fix when the wrong Python runs it


def test_console_script_is_installed() -> None:
    out = _labkit("--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: labkit")


@pytest.mark.skipif(shutil.which("python3.11") is None, reason="needs a Python 3.11")
def test_system_python_gets_the_fix_not_a_traceback() -> None:
    out = subprocess.run(
        [shutil.which("python3.11") or "", "-m", "labkit", "doctor"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_env(PYTHONPATH=str(ROOT)),
        timeout=60,
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "No module named" not in out.stderr
    assert "make setup" in out.stderr and ".venv/bin/labkit doctor" in out.stderr


def test_each_command_is_one_module_in_the_table_and_the_readme(
    capsys: pytest.CaptureFixture[str],
) -> None:
    table = commands()
    readme = (ROOT / "README.md").read_text()
    for name, command in table.items():
        module = name.replace("-", "_")  # `labkit gpu-check` is labkit.cli.gpu_check
        assert command.__name__ == f"labkit.cli.{module}", name  # one module per command
        assert f"labkit {name}" in readme, f"README's command table lacks `labkit {name}`"
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = " ".join(capsys.readouterr().out.split())  # argparse wraps a long name's line
    assert all(f" {name} {command.HELP}" in listed for name, command in table.items())


def test_a_usage_error_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["room", "/no/such/folder"]) == 2
    assert capsys.readouterr().err == "error: no such file or folder: /no/such/folder\n"


def test_missing_packages_are_named_with_the_fix() -> None:
    problem = environment_problem("run", ("jax", "no_such_module_xyz"))
    assert problem is not None
    assert "lacks no_such_module_xyz" in problem and ".venv/bin/labkit run" in problem
    assert environment_problem("doctor") is None


# --------------------------------------------------------------------------------------
# labkit run: papermill's own -p / -y, a whole-notebook timeout, errors in the terminal


def test_parameters_pass_to_papermill_unchanged(tmp_path: Path) -> None:
    nb = _notebook(tmp_path / "p.ipynb", ["print(SIZES)"], "SIZES = [1]\nMODE = 'auto'")
    args = papermill_args([("MODE", "[1, 2]"), ("MODE", "cpu")], ["SIZES: [3, 4]"], [nb])
    assert args == ["-y", "SIZES: [3, 4]", "-p", "MODE", "[1, 2]", "-p", "MODE", "cpu"]
    cmd = preflight.papermill_command(nb, tmp_path / "o.ipynb", None, args)
    assert cmd[-len(args) :] == args
    assert list(parameter_defaults(nb)) == ["SIZES", "MODE"]


@pytest.mark.parametrize(
    ("parameters", "yaml_texts", "match"),
    [
        (
            [("SIZE", "3")],
            [],
            "-p SIZE 3: p.ipynb has no parameter SIZE (its parameters: SIZES, MODE)",
        ),
        ([], ["SIZ: 3"], "-y 'SIZ: 3': p.ipynb has no parameter SIZ"),
        ([("SIZES=[1]", "x.ipynb")], [], "-p takes NAME VALUE"),
        ([], ["[1, 2]"], "YAML mapping"),
        ([], ["SIZES: [1"], "is not YAML"),
    ],
)
def test_bad_parameters_say_what_is_valid(
    tmp_path: Path, parameters: list[tuple[str, str]], yaml_texts: list[str], match: str
) -> None:
    nb = _notebook(tmp_path / "p.ipynb", ["print(SIZES)"], "SIZES = [1]\nMODE = 'auto'")
    with pytest.raises(UsageError) as refused:
        papermill_args(parameters, yaml_texts, [nb])
    assert match in str(refused.value)


def test_parameters_are_checked_per_notebook(tmp_path: Path) -> None:
    one = _notebook(tmp_path / "one.ipynb", ["print(PRESET)"], "PRESET = 'tiny'\nMODE = 'auto'")
    other = _notebook(tmp_path / "other.ipynb", ["print(MODE)"], "MODE = 'auto'\nBATCH = 8")
    assert papermill_args([("PRESET", "small")], [], [one]) == ["-p", "PRESET", "small"]
    with pytest.raises(UsageError) as refused:
        papermill_args([("PRESET", "small")], [], [one, other])
    assert str(refused.value) == (
        "-p PRESET small: other.ipynb has no parameter PRESET (its parameters: MODE, BATCH); "
        "run the notebooks that take it on their own"
    )


def test_an_old_parameter_name_is_passed_as_the_new_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cell = "GLOBAL_BATCH = 8\nTRAIN_STEPS = 3\nMODE = 'auto'"
    new = _notebook(tmp_path / "new.ipynb", ["print(GLOBAL_BATCH)"], cell)
    args = papermill_args([("BATCH", "16")], ["{STEPS: 5, MODE: cpu}"], [new])
    assert args == ["-y", "{TRAIN_STEPS: 5, MODE: cpu}", "-p", "GLOBAL_BATCH", "16"]
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "note: the parameter STEPS is called TRAIN_STEPS now; labkit run passes STEPS as "
        "TRAIN_STEPS until the next release (plain papermill does not)",
        "note: the parameter BATCH is called GLOBAL_BATCH now; labkit run passes BATCH as "
        "GLOBAL_BATCH until the next release (plain papermill does not)",
    ]
    with pytest.raises(UsageError) as refused:
        papermill_args([("BATCH", "0")], [], [new])
    assert "-p BATCH 0: new.ipynb's GLOBAL_BATCH takes a positive" in str(refused.value)  # typed


def test_batch_stays_where_a_notebook_still_has_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    call = _notebook(tmp_path / "call.ipynb", ["print(BATCH)"], "BATCH = 1\nMODE = 'auto'")
    step = _notebook(tmp_path / "step.ipynb", ["print(MODE)"], "GLOBAL_BATCH = 8\nMODE = 'auto'")
    assert papermill_args([("BATCH", "4")], [], [call]) == ["-p", "BATCH", "4"]
    with pytest.raises(UsageError) as refused:
        papermill_args([("BATCH", "4")], [], [call, step])
    assert "BATCH is called GLOBAL_BATCH there now; run the notebooks" in str(refused.value)
    assert capsys.readouterr().err == ""  # nothing renamed


def test_the_lessons_use_the_new_parameter_names() -> None:
    lessons = preflight.notebooks(ROOT / "notebooks", solutions=False)
    names = {path.name: parameter_defaults(path) for path in lessons}
    assert [n for n, known in names.items() if "STEPS" in known] == []
    for old, new in RENAMED.items():
        taking = [path for path in lessons if new in names[path.name]]
        assert len(taking) >= 5, f"{new}: {taking}"
        assert all(new_name(old, [path]) == new for path in taking)
    assert new_name("BATCH", [ROOT / "notebooks" / "09_kernels.ipynb"]) is None  # one call's


@pytest.mark.notebook
def test_labkit_run_takes_an_old_name_for_one_release(tmp_path: Path) -> None:
    nb = _notebook(tmp_path / "a.ipynb", ["print(TRAIN_STEPS)"], "TRAIN_STEPS = 3")
    run = _labkit("run", str(nb), "--out", str(tmp_path / "out"), "-p", "STEPS", "7")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "note: the parameter STEPS is called TRAIN_STEPS now" in run.stderr
    executed = nbformat.read(tmp_path / "out" / "executed" / "a.ipynb", as_version=4)
    assert executed.cells[-1].outputs[0]["text"] == "7\n"


# What a newcomer types, and the one line each gets (exit 2, nothing run, no traceback).
BAD_RUNS = {
    "run notebooks/00_welcome.md": "is the notebook's MyST text: run the notebook",
    "run notebooks/03_sharding.ipynb notebooks/09_kernels.ipynb -p TOLERANCE 0.2": (
        "-p TOLERANCE 0.2: 09_kernels.ipynb has no parameter TOLERANCE (its parameters: MODE,"
    ),
    "run notebooks/03_sharding.ipynb -p GLOBAL_BATCH 0": (
        "03_sharding.ipynb's GLOBAL_BATCH takes a positive whole number like its default 32; got 0"
    ),
    "run notebooks/00_welcome.ipynb -y 'ROOFLINE_SIZES: [0, -5]'": (
        "ROOFLINE_SIZES takes a list of positive whole numbers like its default"
    ),
    "run notebooks/00_welcome.ipynb -p REPEATS 2.5": (
        "REPEATS takes a positive whole number like its default 5; got 2.5"
    ),
    "run notebooks/00_welcome.ipynb -p ROOFLINE_SIZES '[1, 2]'": (
        "(-p passes text: give a list with -y, e.g. -y 'ROOFLINE_SIZES: [128, 256, 512, 1024]')"
    ),
    "run notebooks/00_welcome.ipynb -p MODE=cpu": "got 'MODE=cpu': write -p NAME VALUE",
    "run -p MODE=cpu notebooks/00_welcome.ipynb": "got 'MODE=cpu': write -p NAME VALUE",
    "run notebooks/00_welcome.ipynb -p MODE=cpu --timeout 60": "write -p NAME VALUE",
    "run notebooks/00_welcome.ipynb --timeout 0": (
        "argument --timeout: must be at least 1 second (each notebook's time limit), got 0"
    ),
    "run --timeout -5": "must be at least 1 second",
    "run notebooks/00_welcome.ipynb --out README.md/build": (
        "--out README.md/build: cannot write there (Not a directory); give a folder you can"
    ),
    "doctor --cpu-devices 100000": (
        "cpu_devices must be between 1 and 1024, got 100000: each virtual device costs memory"
    ),
}


@pytest.mark.parametrize("typed", sorted(BAD_RUNS))
def test_a_bad_run_gets_one_line_before_any_work(typed: str) -> None:
    start = time.perf_counter()
    out = _labkit(*shlex.split(typed))
    assert out.returncode == 2, out.stdout + out.stderr
    assert BAD_RUNS[typed] in out.stderr and "Traceback" not in out.stderr
    error_lines = [ln for ln in out.stderr.splitlines() if "error" in ln]
    assert len(error_lines) == 1, out.stderr  # one line (after argparse's usage, if any)
    assert out.stdout == "" and time.perf_counter() - start < 60  # refused, not run


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("", "is empty (0 bytes): restore it (git checkout -- "),
        ('{"cells": [{"cell_type": "code", "sou', "is not valid notebook JSON (Unterminated"),
        ('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}', "no code cells"),
        ('{"a": 1}', "is JSON but not a Jupyter notebook"),
    ],
)
def test_a_broken_notebook_gets_one_line(tmp_path: Path, content: str, said: str) -> None:
    path = tmp_path / "broken.ipynb"
    path.write_text(content)
    out = _labkit("run", str(path), "--out", str(tmp_path / "out"))
    assert out.returncode == 2 and said in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_folder_runs_its_notebooks_or_says_it_has_none(tmp_path: Path) -> None:
    out = _labkit("run", str(tmp_path), "--out", str(tmp_path / "out"))
    assert out.returncode == 2 and "is a folder with no .ipynb in it" in out.stderr
    _notebook(tmp_path / "a.ipynb", ["print('a')"])
    _notebook(tmp_path / "b.ipynb", ["print('b')"])
    out = _labkit("run", str(tmp_path), "--out", str(tmp_path / "out"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "a.ipynb" in out.stdout and "b.ipynb" in out.stdout


@pytest.mark.skipif(env.nvidia_gpu_present(), reason="checks the no-GPU message")
def test_run_refuses_jax_platforms_cuda_without_a_gpu() -> None:
    out = _labkit("run", "notebooks/00_welcome.ipynb", JAX_PLATFORMS="cuda")
    assert out.returncode == 2 and out.stdout == ""
    assert "JAX_PLATFORMS=cuda but this machine has no NVIDIA GPU" in out.stderr  # as doctor


def test_run_refuses_xla_flags_that_would_kill_the_kernel(tmp_path: Path) -> None:
    flag = "--xla_gpu_enable_latncy_hiding_scheduler=true"
    out = _labkit("run", "notebooks/00_welcome.ipynb", "--out", str(tmp_path), XLA_FLAGS=flag)
    assert out.returncode == 2 and out.stdout == "", out.stdout
    assert "XLA_FLAGS would abort JAX at its first operation" in out.stderr
    assert f"| {flag} | unknown |" in out.stderr  # the verdict of `labkit flags check`
    assert "did you mean --xla_gpu_enable_latency_hiding_scheduler?" in out.stderr
    assert not (tmp_path / "executed").exists()


def test_named_choices_list_the_valid_values(tmp_path: Path) -> None:
    out = _labkit("doctor", "--mode", "tpu")
    assert out.returncode == 2 and "choose from 'auto', 'cpu', 'gpu'" in out.stderr
    out = _labkit("run", str(tmp_path / "nope.ipynb"))
    assert out.returncode == 2 and "no such notebook" in out.stderr
    assert "notebooks/00_welcome.ipynb" in out.stderr  # the ones that exist
    out = _labkit("frobnicate")
    assert out.returncode == 2 and "choose from" in out.stderr


@pytest.mark.notebook
def test_run_matches_papermill_and_prints_failures(tmp_path: Path) -> None:
    show = "print(type(NAME).__name__, NAME, type(STEPS).__name__, STEPS)"
    cell = "NAME = 'a'\nSTEPS = [1]"
    good = _notebook(tmp_path / "01_good.ipynb", [show], cell)
    leaves = "import tempfile; (tempfile.mkdtemp() + '/x')"  # a temporary folder, never removed
    bad = _notebook(tmp_path / "02_bad.ipynb", [leaves, "raise ValueError('boom')"], cell)
    (tmp_path / "tmp").mkdir()
    run = _labkit(
        "run",
        str(good),
        str(bad),
        "--out",
        str(tmp_path / "out"),
        "-p",
        "NAME",
        "[1, 2]",
        "-y",
        "STEPS: [3, 4]",
        TMPDIR=str(tmp_path / "tmp"),
    )
    assert run.returncode == 1
    assert "ValueError: boom" in run.stdout  # the failing cell's error, in the terminal
    executed = tmp_path / "out" / "executed" / "01_good.ipynb"
    assert f"01_good.ipynb  -> {executed}" in run.stdout  # where each executed notebook went
    assert f"executed notebooks: {tmp_path / 'out' / 'executed'}/" in run.stdout
    assert list((tmp_path / "tmp").iterdir()) == []  # the failed run's folder is gone too
    printed = nbformat.read(executed, as_version=4).cells[-1].outputs[0]["text"]
    assert printed == "str [1, 2] list [3, 4]\n"  # papermill's rules: -p gives a string
    same = ["-p", "NAME", "[1, 2]", "-y", "STEPS: [3, 4]", "--log-level", "ERROR"]
    plain = subprocess.run(
        [sys.executable, "-m", "papermill", str(good), str(tmp_path / "plain.ipynb"), *same],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert plain.returncode == 0, plain.stderr
    ran = nbformat.read(tmp_path / "plain.ipynb", as_version=4)
    assert ran.cells[-1].outputs[0]["text"] == printed


def test_timeout_is_for_the_whole_notebook(tmp_path: Path) -> None:
    slow = _notebook(tmp_path / "slow.ipynb", ["import time", "time.sleep(60)"])
    start = time.perf_counter()
    run = _labkit("run", str(slow), "--out", str(tmp_path / "out"), "--timeout", "3")
    assert time.perf_counter() - start < 30
    assert run.returncode == 1
    assert "timed out after 3 s (whole notebook)" in run.stdout
    assert "whole notebook" in _labkit("run", "--help").stdout


def test_a_timed_out_run_leaves_no_file_behind(tmp_path: Path) -> None:
    made = "import pathlib, tempfile; (pathlib.Path(tempfile.mkdtemp()) / 'x').write_text('x')"
    slow = _notebook(tmp_path / "slow.ipynb", [made, "import time; time.sleep(120)"])
    tmp, runtime = tmp_path / "tmp", tmp_path / "runtime"
    tmp.mkdir()
    runtime.mkdir()
    run = _labkit(
        "run",
        str(slow),
        "--out",
        str(tmp_path / "out"),
        "--timeout",
        "15",
        TMPDIR=str(tmp),
        JUPYTER_RUNTIME_DIR=str(runtime),
    )
    assert "timed out after 15 s" in run.stdout, run.stdout + run.stderr
    # the notebook's temporary folder, and the kernel's connection file (it holds its key)
    assert list(tmp.iterdir()) == [] and list(runtime.iterdir()) == []


def test_two_runs_into_one_folder_never_mix(tmp_path: Path) -> None:
    slow = _notebook(tmp_path / "slow.ipynb", ["import time; time.sleep(8)"])
    out = tmp_path / "out"
    first = subprocess.Popen(
        [str(BIN / "labkit"), "run", str(slow), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=ROOT,
    )
    try:
        for _ in range(600):  # papermill writes the executed notebook when it starts
            if (out / "executed" / "slow.ipynb").exists() or first.poll() is not None:
                break
            time.sleep(0.1)
        second = _labkit("run", str(slow), "--out", str(out))
        assert second.returncode == 2 and second.stdout == ""
        assert f"another `labkit run` is writing to {out}/ now" in second.stderr
        assert f"--out {out}-2" in second.stderr
        elsewhere = _labkit("run", str(slow), "--out", str(tmp_path / "other"))
        assert elsewhere.returncode == 0, elsewhere.stdout + elsewhere.stderr
    finally:
        stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stdout + stderr
    assert "1 of 1 notebooks ran" in (out / "report.md").read_text()


# --------------------------------------------------------------------------------------
# XLA flags: --help, dashes from web pages, a removed flag in the shell


def test_flags_help_is_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert flags_cli.main(["check", "--help"]) == 0
    assert flags_cli.main(["--help"]) == 0
    assert "usage: labkit flags check" in capsys.readouterr().out
    assert flags_cli.main(["chek"]) == 2
    assert "usage: labkit flags check [--warn] [FLAGS...]" in capsys.readouterr().err


@pytest.mark.parametrize("dash", ["\u2013", "\u2014", "\u2212"])
def test_flags_name_a_dash_from_a_web_page(dash: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert flags_cli.main(["check", f"{dash}xla_foo=1"]) == 1
    err = capsys.readouterr().err
    assert f"U+{ord(dash):04X}" in err and "not two ASCII hyphens" in err
    assert "Type it as --xla_foo=1" in err


def test_flags_check_of_nothing_is_nothing_to_check() -> None:
    out = _labkit("flags", "check", "")  # XLA_FLAGS unset (_env drops it)
    assert out.returncode == 0 and "nothing to check" in out.stdout, out.stderr
    assert "Traceback" not in out.stderr


def test_flags_check_says_a_string_flag_needs_a_value() -> None:
    out = _labkit("flags", "check", "--xla_dump_to")
    assert out.returncode == 1, out.stderr
    assert "| --xla_dump_to | bad_value | needs a value: write --xla_dump_to=VALUE" in out.stdout


def test_doctor_survives_a_removed_flag_in_xla_flags() -> None:
    out = _labkit("doctor", XLA_FLAGS="--xla_gpu_enable_async_collectives=true --xla_dump_to")
    assert "Unknown flag in XLA_FLAGS" not in out.stderr, out.stderr
    assert "| --xla_gpu_enable_async_collectives=true | removed |" in out.stdout
    assert "| --xla_dump_to | bad_value | needs a value" in out.stdout
    assert "2 of 2 flags would abort JAX" in out.stdout
    assert "doctor goes on with XLA_FLAGS=''" in out.stdout
    assert "num_devices   8" in out.stdout and "h100 test compile: ok" in out.stdout
    assert out.returncode == 1  # the shell's XLA_FLAGS would still abort JAX


# --------------------------------------------------------------------------------------
# Make: conda environments, the kernel spec, JupyterLab


@pytest.mark.parametrize(("version", "uses_conda"), [("0.12.0.1", True), ("0.10.2", False)])
def test_make_uses_an_active_conda_env_with_the_pins(
    tmp_path: Path, version: str, uses_conda: bool
) -> None:
    prefix = tmp_path / "conda"
    (prefix / "bin").mkdir(parents=True)
    fake = prefix / "bin" / "python"
    fake.write_text(f"#!/bin/sh\necho {version}\n")  # answers the Makefile's version query
    fake.chmod(0o755)
    (prefix / ".labkit-installed").touch()
    out = subprocess.run(
        ["make", "-n", "doctor", f"CONDA_PREFIX={prefix}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    expected = f"{prefix}/bin/labkit doctor" if uses_conda else ".venv/bin/labkit doctor"
    assert expected in out.stdout.splitlines()


def test_kernel_install_writes_the_labs_quiet_kernel(tmp_path: Path) -> None:
    from labkit.cli import kernel

    folder = kernel.install("python3", tmp_path, gpu=False)
    assert folder == tmp_path / "share" / "jupyter" / "kernels" / "python3"
    spec = json.loads((folder / "kernel.json").read_text())
    assert spec["display_name"] == "Python 3 (OpenXLA lab)"
    assert spec["argv"][0] == sys.executable and spec["argv"][-1] == "--IPKernelApp.log_level=ERROR"
    assert spec["argv"][1:3] == ["-m", "labkit.cli.kernel_start"]  # XLA_FLAGS checked first
    assert spec["env"] == {
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        "JAX_PLATFORMS": "cpu",
    }
    gpu = kernel.install("labkit-torch", tmp_path, gpu=True)
    assert "JAX_PLATFORMS" not in json.loads((gpu / "kernel.json").read_text())["env"]
    assert sorted(p.name for p in folder.parent.iterdir()) == ["labkit-torch", "python3"]
    with pytest.raises(UsageError, match="kernel name must be one of labkit-torch, python3"):
        kernel.install("python4", tmp_path)


def test_make_s_kernel_spec_is_the_command_s(tmp_path: Path) -> None:
    # tools/kernel-spec, which make runs, is `labkit kernel install`: one spec, one copy of it
    tool = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "kernel-spec"), str(tmp_path / "tool")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tool.returncode == 0, tool.stderr
    command = _labkit("kernel", "install", str(tmp_path / "command"))
    assert command.returncode == 0, command.stderr
    assert command.stdout.startswith(f"kernel spec: {tmp_path / 'command'}/share/jupyter/kernels")
    spec = "share/jupyter/kernels/python3/kernel.json"
    assert (tmp_path / "tool" / spec).read_text() == (tmp_path / "command" / spec).read_text()


def _papermill_stderr(tmp_path: Path, jupyter_path: Path) -> tuple[str, str]:
    """A learner's scratch notebook run in the python3 kernel found on ``jupyter_path``."""
    nb = _notebook(tmp_path / "scratch.ipynb", ["import jax", "print(jax.devices())"])
    out = subprocess.run(
        [sys.executable, "-m", "papermill", str(nb), str(tmp_path / "out.ipynb")],
        capture_output=True,
        text=True,
        env={
            k: v
            for k, v in _env(JUPYTER_PATH=str(jupyter_path)).items()
            if k not in ("TF_CPP_MIN_LOG_LEVEL", "PYDEVD_DISABLE_FILE_VALIDATION")
        },
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    ran = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    cell_err = "".join(o.get("text", "") for c in ran.cells for o in c.outputs)
    return out.stderr, cell_err


@pytest.mark.notebook
@pytest.mark.skipif(
    Path("/proc/driver/nvidia/gpus").exists(), reason="checks the no-GPU plugin noise"
)
def test_kernel_spec_makes_a_scratch_notebook_quiet(tmp_path: Path) -> None:
    from ipykernel.kernelspec import write_kernel_spec

    plain = tmp_path / "plain" / "share" / "jupyter"
    write_kernel_spec(plain / "kernels" / "python3")  # ipykernel's default spec
    stderr, cells = _papermill_stderr(tmp_path, plain)
    # the noise: the first CUDA library the plugin misses (cuDNN, or cuFFT where cuDNN is there)
    assert "without encryption" in stderr and "Unable to load cu" in cells

    lab = tmp_path / "lab"
    made = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "kernel-spec"), str(lab)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    stderr, cells = _papermill_stderr(tmp_path, lab / "share" / "jupyter")
    assert "without encryption" not in stderr and "Unable to load" not in stderr + cells
    assert "Traceback" not in stderr + cells
    assert "CpuDevice" in cells


@pytest.mark.notebook
def test_the_labs_kernel_shows_bad_xla_flags_instead_of_dying(tmp_path: Path) -> None:
    """A learner's own notebook, no setup(): one cell of JAX, XLA_FLAGS with a flag missing
    its value. ipykernel's own kernel dies ("Kernel died"); the lab's runs the cell and shows
    the flag check's table in its output."""
    from labkit.cli import kernel

    kernel.install("python3", tmp_path, gpu=False)
    nb = _notebook(tmp_path / "mine.ipynb", ["import jax.numpy as jnp\nprint(jnp.ones(3).sum())"])
    out = subprocess.run(
        [sys.executable, "-m", "papermill", str(nb), str(tmp_path / "out.ipynb")],
        capture_output=True,
        text=True,
        env=_env(JUPYTER_PATH=str(tmp_path / "share" / "jupyter"), XLA_FLAGS="--xla_dump_to"),
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    (cell,) = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells
    said = "".join(o.get("text", "") for o in cell.outputs)
    assert "| --xla_dump_to | bad_value | needs a value" in said
    assert kernel_start.RESTART in said and said.rstrip().endswith("3.0")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _lab_overrides(settings: Path) -> None:
    """Install JupyterLab's setting defaults into ``settings`` as ``make lab`` does (there:
    the environment's ``share/jupyter/lab/settings``)."""
    make = subprocess.run(
        ["make", "-n", "lab"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    (line,) = [ln for ln in make.stdout.splitlines() if "overrides.d" in ln]
    source, target = line.split()[-2:]
    assert target.endswith("/share/jupyter/lab/settings/overrides.d/labkit.json"), line
    (settings / "overrides.d").mkdir(parents=True)
    shutil.copyfile(ROOT / source, settings / "overrides.d" / "labkit.json")


def test_jupyterlab_shows_one_copy_of_each_lesson(tmp_path: Path) -> None:
    config = ROOT / "tools" / "jupyter_server_config.json"
    assert "--config=tools/jupyter_server_config.json" in (ROOT / "Makefile").read_text()
    _lab_overrides(tmp_path / "settings")
    port, token = _free_port(), "labkit-test"
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "jupyter", "lab", "--ip=127.0.0.1", f"--port={port}"),
            *("--no-browser", "--notebook-dir=notebooks", f"--config={config}", "--allow-root"),
            *(f"--IdentityProvider.token={token}", f"--ServerApp.runtime_dir={tmp_path}"),
            f"--LabApp.app_settings_dir={tmp_path / 'settings'}",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**_env(), "JUPYTER_CONFIG_DIR": str(tmp_path / "config")},
    )

    def get(path: str) -> Any:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/{path}", headers={"Authorization": f"token {token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.load(answer)

    def listing(folder: str) -> list[tuple[str, str]]:
        return [(c["name"], c["type"]) for c in get(f"api/contents/{folder}")["content"]]

    try:
        for _ in range(120):
            try:
                top = listing("")
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("jupyter lab did not answer within 60 s")
        solutions = listing("solutions")
        # "none" would pop up "get notified about official Jupyter news?" on the first start
        notices = get("lab/api/settings/@jupyterlab/apputils-extension:notification")
    finally:
        server.terminate()
        server.wait(timeout=30)
    for names in (top, solutions):
        lessons = [n for n, _ in names if n[:2].isdigit()]
        assert lessons and all(n.endswith(".ipynb") for n in lessons), names
    assert ("00_welcome.ipynb", "notebook") in top
    defaults = notices["schema"]["properties"]  # with the overrides applied
    assert defaults["fetchNews"]["default"] == "false", defaults["fetchNews"]
    assert defaults["checkForUpdates"]["default"] is False


@pytest.mark.parametrize("newer", ["md", "ipynb"])
def test_open_save_sync_leaves_every_notebook_unchanged(tmp_path: Path, newer: str) -> None:
    """JupyterLab's save (jupytext's contents manager: get the model, save it back), then
    ``make sync``: every .md and .ipynb keeps its bytes, so git status stays clean. The .md
    is newer as after a clone; the .ipynb is newer after ``labkit outputs`` or a pull."""
    import jupytext

    copy = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", copy, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    files = sorted(p for p in copy.rglob("*") if p.suffix in (".md", ".ipynb"))
    before = {p: p.read_bytes() for p in files}
    for path in files:
        age = 0 if path.suffix == f".{newer}" else 60  # seconds before now
        os.utime(path, (time.time() - age, time.time() - age))
    notebooks = sorted(p.relative_to(copy) for p in files if p.suffix == ".ipynb")
    assert len(notebooks) >= 20, notebooks  # lessons and solutions
    manager = jupytext.TextFileContentsManager(root_dir=str(copy))
    for path in notebooks:
        model = manager.get(str(path), content=True, type="notebook")
        manager.save(model, str(path))
    sync = subprocess.run(
        [sys.executable, "-m", "jupytext", "--sync", *map(str, sorted(copy.rglob("*.ipynb")))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert sync.returncode == 0, sync.stderr
    changed = [str(p.relative_to(copy)) for p in files if p.read_bytes() != before[p]]
    assert changed == [], f"saving and syncing changed {changed}"
    made = {p for p in copy.rglob("*") if ".ipynb_checkpoints" not in p.parts} - set(files)
    assert sorted(p for p in made if p.is_file() and p.suffix in (".md", ".ipynb")) == []


def test_missing_torch_kernel_names_the_make_target(tmp_path: Path) -> None:
    stderr = "jupyter_client.kernelspec.NoSuchKernel: No such kernel named labkit-torch\n"
    error = preflight._error_of(tmp_path / "absent.ipynb", stderr)
    assert error == (
        "this notebook runs in PyTorch's kernel (labkit-torch), not installed here: "
        "build it with `make setup-torch`"
    )  # one line, no traceback tail
    assert "setup-torch" not in preflight._error_of(tmp_path / "absent.ipynb", "Boom\n")
