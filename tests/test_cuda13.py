"""`make setup CUDA=13`: JAX's CUDA 13 wheels, pinned, with a conda file and a Makefile that agree.

CUDA 12 stays the default. The CUDA 13 compile-only stack (the plugin, its PJRT library,
ptxas and libdevice) is not installed by `make test`: one environment holds one CUDA
plugin, and a second environment would cost about 2 GB. What is checked here is what
`make setup CUDA=13` and environment-gpu-cuda13.yml would install.
"""

from __future__ import annotations

import subprocess

import pytest
from packaging.utils import canonicalize_name
from pins import EXTRAS, ROOT, constraints, pins, requirements, yml_pins

JAX = constraints()["jax"]


def test_cuda13_extras_follow_jax_and_pin_one_cuda_release() -> None:
    assert EXTRAS["cuda13"] == ["jax[cuda13]"]  # JAX's CUDA 13 wheels of the installed jax
    assert "jax[cuda13-local]" in EXTRAS["aot13"]  # the plugin of jax's version, no runtime
    # ptxas (nvcc) and libdevice (nvvm, its own wheel since CUDA 13) of one CUDA release, pinned
    # here: no lock file holds them (one environment holds one CUDA version)
    nvidia = pins([s for s in EXTRAS["aot13"] if s.startswith("nvidia-")])
    assert {"nvidia-cuda-nvcc", "nvidia-nvvm"} <= set(nvidia)
    assert len(set(nvidia.values())) == 1 and next(iter(nvidia.values())).startswith("13.")


def test_conda_cuda13_file_matches_pyproject() -> None:
    listed = yml_pins("environment-gpu-cuda13.yml")
    locked = constraints()
    extras = ("cuda13", "export", "tf", "lab", "test")
    needed = {canonicalize_name(r.name) for r in requirements(extras)}
    assert needed <= set(listed), needed - set(listed)
    assert listed == {name: locked[name] for name in listed}
    assert listed["jax"] == JAX
    text = (ROOT / "environment-gpu-cuda13.yml").read_text()
    assert f"jax[cuda13]=={JAX}" in text
    lines = [ln.strip().removeprefix("- ") for ln in text.splitlines()]
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
