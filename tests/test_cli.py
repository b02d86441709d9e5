"""The ``labkit`` command as a newcomer meets it: one form that works, clear messages, quiet
kernels, one copy of each lesson in JupyterLab."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from labkit.cli import environment_problem, papermill_args, preflight
from labkit.cli import flags as flags_cli

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _notebook(path: Path, cells: list[str], parameters: str | None = None) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    if parameters is not None:
        cell = nbformat.v4.new_code_cell(parameters)
        cell.metadata["tags"] = ["parameters"]
        nb.cells.insert(0, cell)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, path)
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


def test_missing_packages_are_named_with_the_fix() -> None:
    problem = environment_problem("run", ("jax", "no_such_module_xyz"))
    assert problem is not None
    assert "lacks no_such_module_xyz" in problem and ".venv/bin/labkit run" in problem
    assert environment_problem("doctor") is None


# --------------------------------------------------------------------------------------
# labkit run: papermill's own -p / -y, a whole-notebook timeout, errors in the terminal


def test_parameters_pass_to_papermill_unchanged(tmp_path: Path) -> None:
    nb = _notebook(tmp_path / "p.ipynb", ["print(SIZES)"], "SIZES = [1]\nMODE = 'auto'")
    args = papermill_args([("SIZES", "[1, 2]"), ("MODE", "cpu")], ["SIZES: [3, 4]"], [nb])
    assert args == ["-p", "SIZES", "[1, 2]", "-p", "MODE", "cpu", "-y", "SIZES: [3, 4]"]
    cmd = preflight.papermill_command(nb, tmp_path / "o.ipynb", None, args)
    assert cmd[-len(args) :] == args
    assert preflight.parameter_names(nb) == ["SIZES", "MODE"]


@pytest.mark.parametrize(
    ("parameters", "yaml_texts", "match"),
    [
        ([("SIZE", "3")], [], "unknown parameter SIZE: the notebooks' parameters are MODE, SIZES"),
        ([], ["SIZ: 3"], "unknown parameter SIZ"),
        ([("SIZES=[1]", "x.ipynb")], [], "-p takes NAME VALUE"),
        ([], ["[1, 2]"], "YAML mapping"),
        ([], ["SIZES: [1"], "is not YAML"),
    ],
)
def test_bad_parameters_say_what_is_valid(
    tmp_path: Path, parameters: list[tuple[str, str]], yaml_texts: list[str], match: str
) -> None:
    nb = _notebook(tmp_path / "p.ipynb", ["print(SIZES)"], "SIZES = [1]\nMODE = 'auto'")
    error = papermill_args(parameters, yaml_texts, [nb])
    assert isinstance(error, str) and match in error


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
    show = "print(type(SIZES).__name__, SIZES, type(STEPS).__name__, STEPS)"
    good = _notebook(tmp_path / "01_good.ipynb", [show], "SIZES = [1]\nSTEPS = 1")
    bad = _notebook(tmp_path / "02_bad.ipynb", ["raise ValueError('boom')"])
    run = _labkit(
        "run", str(good), str(bad), "--out", str(tmp_path / "out"), "-p", "SIZES", "[1, 2]",
        "-y", "STEPS: [3, 4]",
    )  # fmt: skip
    assert run.returncode == 1
    assert "ValueError: boom" in run.stdout  # the failing cell's error, in the terminal
    executed = nbformat.read(tmp_path / "out" / "executed" / "01_good.ipynb", as_version=4)
    printed = executed.cells[-1].outputs[0]["text"]
    assert printed == "str [1, 2] list [3, 4]\n"  # papermill's rules: -p gives a string
    same = ["-p", "SIZES", "[1, 2]", "-y", "STEPS: [3, 4]", "--log-level", "ERROR"]
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


# --------------------------------------------------------------------------------------
# XLA flags: --help, dashes from web pages, a removed flag in the shell


def test_flags_help_is_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert flags_cli.main(["check", "--help"]) == 0
    assert flags_cli.main(["--help"]) == 0
    assert "usage: labkit flags check" in capsys.readouterr().out
    assert flags_cli.main(["chek"]) == 2
    assert "usage: labkit flags check [FLAGS...]" in capsys.readouterr().err


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_jupyterlab_shows_one_copy_of_each_lesson(tmp_path: Path) -> None:
    config = ROOT / "tools" / "jupyter_server_config.json"
    assert "--config=tools/jupyter_server_config.json" in (ROOT / "Makefile").read_text()
    port, token = _free_port(), "labkit-test"
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "jupyter", "lab", "--ip=127.0.0.1", f"--port={port}"),
            *("--no-browser", "--notebook-dir=notebooks", f"--config={config}", "--allow-root"),
            *(f"--IdentityProvider.token={token}", f"--ServerApp.runtime_dir={tmp_path}"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**_env(), "JUPYTER_CONFIG_DIR": str(tmp_path / "config")},
    )

    def listing(folder: str) -> list[tuple[str, str]]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/contents/{folder}",
            headers={"Authorization": f"token {token}"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            return [(c["name"], c["type"]) for c in json.load(answer)["content"]]

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
    finally:
        server.terminate()
        server.wait(timeout=30)
    for names in (top, solutions):
        lessons = [n for n, _ in names if n[:2].isdigit()]
        assert lessons and all(n.endswith(".ipynb") for n in lessons), names
    assert ("00_welcome.ipynb", "notebook") in top


def test_missing_torch_kernel_names_the_make_target(tmp_path: Path) -> None:
    from labkit.cli import preflight

    stderr = "jupyter_client.kernelspec.NoSuchKernel: No such kernel named labkit-torch\n"
    error = preflight._error_of(tmp_path / "absent.ipynb", stderr)
    assert "No such kernel named labkit-torch" in error
    assert "make setup-torch" in error
    assert "setup-torch" not in preflight._error_of(tmp_path / "absent.ipynb", "Boom\n")
