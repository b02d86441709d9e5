"""The three descriptions of the environment agree: pyproject, constraints.txt, environment.yml."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9_.\-\[\]]+)==([^\s;#]+)")


def _pyproject_pins(
    extras: tuple[str, ...] = ("aot", "export", "tf", "lab", "test"),
) -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in extras:
        specs += project["optional-dependencies"][extra]
    pins = {}
    for spec in specs:
        match = PIN.match(spec)
        assert match, f"pyproject dependency {spec!r} is not pinned exactly (==)"
        pins[match.group(1).lower()] = match.group(2)
    return pins


def _yaml_pip_pins(name: str = "environment.yml") -> dict[str, str]:
    pins = {}
    for line in (ROOT / name).read_text().splitlines():
        match = PIN.match(line.strip().removeprefix("- "))
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        match = PIN.match(line)
        if match:
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def test_environment_yml_matches_pyproject() -> None:
    assert _yaml_pip_pins() == _pyproject_pins()


def test_gpu_environment_yml_matches_pyproject() -> None:
    assert _yaml_pip_pins("environment-gpu.yml") == _pyproject_pins(
        ("cuda", "export", "tf", "lab", "test")
    )


def test_environment_ymls_lock_indirect_packages_too() -> None:
    for name in ("environment.yml", "environment-gpu.yml"):
        lines = [ln.strip() for ln in (ROOT / name).read_text().splitlines()]
        assert "- -c constraints.txt" in lines, f"{name}: pip section must use constraints.txt"
        assert "- -e ." in lines


def test_constraints_agree_with_pyproject() -> None:
    locked = _constraints()
    for name, version in _pyproject_pins().items():
        assert locked.get(name.replace("_", "-")) == version, f"{name}: run `make lock`"


def test_installed_versions_are_the_pinned_ones() -> None:
    for name, version in _pyproject_pins().items():
        assert importlib.metadata.version(name) == version, f"{name}: run `make setup`"


def test_python_is_new_enough() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.12"
    assert "python=3.12" in (ROOT / "environment.yml").read_text()
    assert "python=3.12" in (ROOT / "environment-gpu.yml").read_text()


def test_ci_runs_exactly_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [ln for ln in ci.splitlines() if ln and not ln.startswith(("#", "set ", "cd "))]
    assert commands == ["make test"]
    assert "make test" in (ROOT / "README.md").read_text()
