"""A learner's own environment, as pip leaves it: without the CUDA plugin, or with other
versions of jaxlib and the plugin. What labkit says there, in separate Python processes.

A venv without the `aot` extra is made in a second from this one: its site-packages links to
this environment's packages, less the CUDA plugin's and NVIDIA's wheels. Other versions are
installed metadata put first on the path (a dist-info of the same name with another
Version): what pip reports and labkit reads, while the code stays this jaxlib's. The real
installs take minutes and gigabytes each, more than `make test` can spend: with
LABKIT_TEST_OWN_ENV=1, test_the_readme_command_in_a_fresh_venv runs the README's
own-environment command in a fresh venv, then 00 and 03 under papermill.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pytest

from labkit.core import env

ROOT = Path(__file__).resolve().parent.parent
CAL = env.CALIBRATED
# What the `aot` extra adds to an environment: the CUDA plugin's two wheels, ptxas's
WITHOUT_AOT = ("jax_plugins", "jax_cuda", "nvidia")


def _environ(**extra: str) -> dict[str, str]:
    drop = ("JAX_PLATFORMS", "XLA_FLAGS", "PYTHONPATH", "JUPYTER_PATH", "VIRTUAL_ENV")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def _run(
    python: Path | str, args: list[str], timeout: int = 300, **extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_environ(**extra),
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def no_aot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with this environment's packages but not the `aot` extra's; its Python."""
    venv = tmp_path_factory.mktemp("no-aot") / "venv"
    made = _run(sys.executable, ["-m", "venv", "--without-pip", str(venv)], timeout=120)
    assert made.returncode == 0, made.stderr
    here = Path(sysconfig.get_paths()["purelib"])
    (site,) = (venv / "lib").glob("python3*/site-packages")
    for entry in here.iterdir():
        if not entry.name.lower().startswith(WITHOUT_AOT):
            (site / entry.name).symlink_to(entry)
    return venv / "bin" / "python"


def test_doctor_without_the_plugin_says_what_to_install(no_aot: Path) -> None:
    out = _run(no_aot, ["-m", "labkit", "doctor"], PYTHONPATH=str(ROOT))
    assert "Traceback" not in out.stderr and "ModuleNotFoundError" not in out.stdout, out.stderr
    assert "h100_compile  False" in out.stdout and "plugins       []" in out.stdout
    assert f"versions: the ones the lessons are calibrated to ({CAL})" in out.stdout
    assert "h100 test compile: not run: the CUDA PJRT plugin is not installed" in out.stdout
    assert (
        "the kit's `aot` extra: in the kit's folder `pip install -c constraints.txt -e \".[aot]\"`"
        in out.stdout
    )
    assert out.returncode == 1  # the lessons' H100 parts cannot run here


@pytest.mark.notebook
def test_00_runs_its_cpu_parts_without_the_plugin(no_aot: Path, tmp_path: Path) -> None:
    kernel = _run(no_aot, ["-m", "labkit", "kernel", "install"], PYTHONPATH=str(ROOT))
    assert kernel.returncode == 0, kernel.stderr
    ran = tmp_path / "00.ipynb"
    args = ["-m", "papermill", str(ROOT / "notebooks" / "00_welcome.ipynb"), str(ran)]
    args += ["-y", "{ROOFLINE_SIZES: [128, 256], REPEATS: 2}"]
    out = _run(
        no_aot, args, PYTHONPATH=str(ROOT), JUPYTER_PATH=str(no_aot.parents[1] / "share/jupyter")
    )
    assert out.returncode == 1  # stopped at the first H100 compile
    assert "without encryption" not in out.stderr  # the kit's kernel spec, installed above
    cells = [c for c in nbformat.read(ran, as_version=4).cells if c.cell_type == "code"]
    outputs = [o for c in cells for o in c.outputs]
    shown = json.dumps(outputs)
    assert "ModuleNotFoundError" not in shown
    (error,) = [o for o in outputs if o.output_type == "error"]
    assert error.ename == "AotUnavailable" and "`aot` extra" in error.evalue
    said = [o.get("text", "") for o in outputs if o.output_type == "stream"]
    assert any("H100 compiles: unavailable here: the CUDA PJRT plugin" in t for t in said)
    assert any("✓ CPU mode: 8 virtual devices" in t for t in said)  # the CPU parts ran
    ran_cells = [c for c in cells if c.execution_count]
    assert cells.index(ran_cells[-1]) >= 4, "the CPU cells before the H100 part ran"


def _other_versions(folder: Path, versions: dict[str, str]) -> Path:
    """A folder of dist-infos that, first on the path, make pip's metadata say ``versions``."""
    for name, version in versions.items():
        real = importlib.metadata.distribution(name)
        info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        if points := real.read_text("entry_points.txt"):  # the plugin's entry point stays
            (info / "entry_points.txt").write_text(points)
    return folder


OLDER = {"jaxlib": "0.11.2", "jax-cuda12-plugin": "0.11.2", "jax-cuda12-pjrt": "0.11.2"}
DIFFERENCE = (
    f"the lessons' claims are calibrated to jax and jaxlib {CAL}; here: jaxlib 0.11.2, "
    "jax-cuda12-plugin 0.11.2, jax-cuda12-pjrt 0.11.2"
)


def test_doctor_names_versions_other_than_the_calibrated_ones(tmp_path: Path) -> None:
    shadow = _other_versions(tmp_path, OLDER)
    out = _run(sys.executable, ["-m", "labkit", "doctor"], PYTHONPATH=f"{ROOT}:{shadow}")
    assert out.returncode == 0, out.stdout + out.stderr  # a difference, not a problem
    assert f"versions: {DIFFERENCE}: some claims may fail, and a failed claim says so" in out.stdout
    fix = f'"jax=={CAL}" "jaxlib=={CAL}" "jax-cuda12-plugin=={CAL}" "jax-cuda12-pjrt=={CAL}"'
    assert f"versions: the calibrated ones: pip install {fix}" in out.stdout
    assert "PROBLEM" not in out.stdout and "h100 test compile: ok" in out.stdout


def test_doctor_refuses_a_plugin_that_jaxlib_refuses(tmp_path: Path) -> None:
    plugin = {"jax-cuda12-plugin": "0.11.2", "jax-cuda12-pjrt": "0.11.2"}
    shadow = _other_versions(tmp_path, plugin)
    out = _run(sys.executable, ["-m", "labkit", "doctor"], PYTHONPATH=f"{ROOT}:{shadow}")
    assert out.returncode == 1
    problem = f"jax-cuda12-plugin 0.11.2, jax-cuda12-pjrt 0.11.2 do not match jaxlib {CAL}"
    assert f"versions: PROBLEM: {problem}" in out.stdout
    assert "h100 test compile: not run: the CUDA plugin does not match jaxlib" in out.stdout
    assert "h100 test compile: ok" not in out.stdout


def test_setup_and_a_failed_claim_name_the_versions(tmp_path: Path) -> None:
    shadow = _other_versions(tmp_path, OLDER)
    code = (
        "from labkit.core.env import setup; setup(mode='cpu'); "
        "from labkit.core.feedback import claim; claim('the step has one all-reduce', 2, 1)"
    )
    out = _run(sys.executable, ["-c", code], PYTHONPATH=f"{ROOT}:{shadow}")
    assert out.returncode == 1
    first, *_, before, last = out.stderr.strip().splitlines()
    assert first == f"labkit: {DIFFERENCE}: some claims may fail, and a failed claim says so " + (
        "(`labkit doctor` compares the versions)"
    )
    assert before.endswith("ClaimFailed: ✗ the step has one all-reduce: found 2, expected 1")
    assert last == f"({DIFFERENCE}: the difference may come from them, not the lesson)"


@pytest.mark.notebook
@pytest.mark.skipif(
    os.environ.get("LABKIT_TEST_OWN_ENV") != "1",
    reason="a fresh venv from PyPI: about 2 GB and 5 minutes; LABKIT_TEST_OWN_ENV=1 runs it",
)
def test_the_readme_command_in_a_fresh_venv(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    command = 'pip install -c constraints.txt -e ".[lessons]"'
    assert command in readme
    venv = tmp_path / "venv"
    assert _run(sys.executable, ["-m", "venv", str(venv)], timeout=120).returncode == 0
    python = venv / "bin" / "python"
    install = _run(python, ["-m", *command.replace('"', "").split()], timeout=1200)
    assert install.returncode == 0, install.stderr[-3000:]
    assert _run(python, ["-m", "labkit", "kernel", "install"]).returncode == 0
    doctor = _run(python, ["-m", "labkit", "doctor"])
    assert doctor.returncode == 0 and f"calibrated to ({CAL})" in doctor.stdout, doctor.stdout
    for name in ("00_welcome", "03_sharding"):
        args = ["-m", "papermill", str(ROOT / "notebooks" / f"{name}.ipynb"), str(tmp_path / name)]
        ran = _run(python, args, timeout=600)
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert "without encryption" not in ran.stderr
