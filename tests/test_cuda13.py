"""`make setup CUDA=13`: JAX's CUDA 13 wheels, pinned, with a conda file and a Makefile that agree.

CUDA 12 stays the default. The CUDA 13 compile-only stack (the plugin, its PJRT library,
ptxas and libdevice) is not installed by `make test`: one environment holds one CUDA
plugin, and a second environment would cost about 2 GB. What is checked here is what
`make setup CUDA=13` and environment-gpu-cuda13.yml would install.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9_.\-\[\]]+)==([^\s;#]+)")
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
JAX = next(
    PIN.match(d).group(2)  # type: ignore[union-attr]
    for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    if d.startswith("jax==")
)


def _pins(specs: list[str]) -> dict[str, str]:
    pins = {}
    for spec in specs:
        match = PIN.match(spec)
        assert match, f"{spec!r} is not pinned exactly (==)"
        pins[match.group(1).lower()] = match.group(2)
    return pins


def test_cuda13_extras_are_exact_and_match_jax() -> None:
    assert _pins(EXTRAS["cuda13"]) == {"jax[cuda13]": JAX}
    aot13 = _pins(EXTRAS["aot13"])
    assert aot13["jax-cuda13-plugin"] == aot13["jax-cuda13-pjrt"] == JAX
    # ptxas (nvcc) and libdevice (nvvm, its own wheel since CUDA 13) of one CUDA release
    nvidia = {k: v for k, v in aot13.items() if k.startswith("nvidia-")}
    assert {"nvidia-cuda-nvcc", "nvidia-nvvm"} <= set(nvidia)
    assert len(set(nvidia.values())) == 1 and next(iter(nvidia.values())).startswith("13.")


def test_conda_cuda13_file_matches_pyproject() -> None:
    text = (ROOT / "environment-gpu-cuda13.yml").read_text()
    lines = [ln.strip().removeprefix("- ") for ln in text.splitlines()]
    listed = _pins([ln for ln in lines if PIN.match(ln)])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in ("cuda13", "export", "tf", "lab", "test"):
        specs += EXTRAS[extra]
    assert listed == _pins(specs)
    assert "-c constraints.txt" in lines and "-e ." in lines


def _dry_run(*args: str) -> str:
    done = subprocess.run(
        ["make", "-n", "-B", "setup", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(("cuda", "extra", "other"), [("12", "", "13"), ("13", "13", "12")])
def test_make_setup_installs_one_cuda_version(cuda: str, extra: str, other: str) -> None:
    plan = _dry_run(f"CUDA={cuda}")
    gpu = subprocess.run(["sh", "-c", "nvidia-smi -L"], capture_output=True).returncode == 0
    assert f'-e ".[{"cuda" if gpu else "aot"}{extra},export,tf,lab,test]"' in plan
    assert f"jax-cuda{other}-plugin jax-cuda{other}-pjrt" in plan  # the other one goes
