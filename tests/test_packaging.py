"""The descriptions of the environment agree: pyproject.toml's ranges (what the kit needs),
constraints.txt's exact pins (what CI tested), the conda files, and the version labkit's
lessons are calibrated to. pip keeps a learner's own jax where it is in range."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version
from pins import EXTRAS, PROJECT, ROOT, constraints, requirements, yml_pins

from labkit.core import env

# What `make setup` installs into .venv on a machine without a GPU (the Makefile's extras).
VENV = ("aot", "export", "tf", "lab", "test")


def _names(extras: tuple[str, ...]) -> set[str]:
    return {canonicalize_name(r.name) for r in requirements(extras)}


def test_constraints_lock_every_requirement_within_its_range() -> None:
    locked = constraints()
    for req in requirements((*VENV, "lessons", "kernels")):
        name = canonicalize_name(req.name)
        assert name in locked, f"{name}: not in constraints.txt; run `make lock`"
        assert req.specifier.contains(locked[name], prereleases=True), (
            f"constraints.txt pins {name}=={locked[name]}, outside pyproject's {req}"
        )


def test_pyproject_keeps_a_jax_you_already_have() -> None:
    # ranges, not pins: an installed jax or jaxlib of 0.11.2 or later stays as it is
    for req in requirements(("lessons",)):
        assert "==" not in str(req.specifier), f"{req}: a range, with the pin in constraints.txt"
        if canonicalize_name(req.name) in ("jax", "jaxlib"):
            assert req.specifier.contains("0.11.2") and req.specifier.contains(env.CALIBRATED)


def test_the_plugin_follows_the_installed_jax() -> None:
    # jax's own extras bring the CUDA plugin of jax's version: jaxlib refuses any other
    for extra, jax_extra in (("aot", "cuda12-local"), ("aot13", "cuda13-local")):
        (jax,) = [r for r in requirements((extra,)) if r.extras]
        assert jax.name == "jax" and jax.extras == {jax_extra} and not jax.specifier, jax
    assert not any(n.startswith("jax-cuda") for n in _names(("aot", "aot13", "lessons")))


def test_the_lessons_extra_carries_what_a_lesson_needs_to_run() -> None:
    names = _names(("lessons",))
    assert {"papermill", "ipykernel", "jupyterlab", "nvidia-cuda-nvcc-cu12", "jax"} <= names
    assert EXTRAS["lessons"][0] == "labkit[aot,lab]"  # the kit's own extras, not copies


def test_calibrated_version_is_the_locked_one() -> None:
    locked = constraints()
    for name in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt"):
        assert locked[name] == env.CALIBRATED, f"{name}: constraints.txt and env.CALIBRATED differ"


def test_conda_files_pin_the_locked_versions() -> None:
    locked = constraints()
    for name, extras in (
        ("environment.yml", VENV),
        ("environment-gpu.yml", ("cuda", "export", "tf", "lab", "test")),
    ):
        listed = yml_pins(name)
        assert _names(extras) <= set(listed), f"{name} lacks {_names(extras) - set(listed)}"
        for package, version in listed.items():
            assert locked.get(package) == version, f"{name}: {package}=={version}, not locked"


def test_environment_ymls_lock_indirect_packages_too() -> None:
    for name in ("environment.yml", "environment-gpu.yml"):
        lines = [ln.strip() for ln in (ROOT / name).read_text().splitlines()]
        assert "- -c constraints.txt" in lines, f"{name}: pip section must use constraints.txt"
        assert "- -e ." in lines


def test_installed_versions_are_the_pinned_ones() -> None:
    locked = constraints()
    for req in requirements(VENV):
        name = canonicalize_name(req.name)
        assert importlib.metadata.version(name) == locked[name], f"{name}: run `make setup`"
    for name, version in env.installed_versions().items():
        assert version is None or Version(version) == Version(locked[name]), name


def test_python_is_new_enough() -> None:
    assert PROJECT["requires-python"] == ">=3.12"
    assert "python=3.12" in (ROOT / "environment.yml").read_text()
    assert "python=3.12" in (ROOT / "environment-gpu.yml").read_text()


def test_ci_runs_exactly_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [ln for ln in ci.splitlines() if ln and not ln.startswith(("#", "set ", "cd "))]
    assert commands == ["make test"]
    assert "make test" in (ROOT / "README.md").read_text()


def test_the_readmes_venv_size_is_the_fresh_one() -> None:
    """README's `.venv of N GB`: what `make setup` builds without a GPU and without extras
    (CI's fresh .venv), within 10%. Elsewhere (another environment, extras) nothing to compare."""
    venv = ROOT / ".venv"
    stamps = sorted(p.name for p in venv.glob(".labkit-installed*"))
    if stamps != [".labkit-installed"] or env.nvidia_gpu_present():
        pytest.skip(f"{venv} is not a plain no-GPU `make setup` environment: {stamps}")
    said = re.search(r"leaves a `\.venv` of \*\*([\d.]+) GB\*\*", (ROOT / "README.md").read_text())
    assert said, "README.md no longer says the size of .venv"
    du = subprocess.run(["du", "-sk", str(venv)], capture_output=True, text=True, check=True)
    gb = int(du.stdout.split()[0]) / 2**20  # as du -sh counts a G
    assert abs(gb - float(said.group(1))) <= 0.1 * gb, (
        f"README says {said.group(1)} GB, du {gb:.2f}"
    )
