"""What pyproject.toml asks for (ranges) and what the lock and conda files pin (exact versions).

Shared by tests/test_packaging.py and tests/test_cuda13.py.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s;#]+)")
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]


def requirements(extras: tuple[str, ...] = ()) -> list[Requirement]:
    """The project's requirements with ``extras``; an extra made of the kit's own extras
    (``labkit[aot,lab]``) is expanded into theirs."""
    found = [Requirement(spec) for spec in PROJECT["dependencies"]]
    for extra in extras:
        for spec in EXTRAS[extra]:
            req = Requirement(spec)
            if canonicalize_name(req.name) == "labkit":
                found += [r for r in requirements(tuple(sorted(req.extras))) if r not in found]
            else:
                found.append(req)
    return found


def pins(lines: list[str]) -> dict[str, str]:
    """``name==version`` lines (extras dropped from the name) as {canonical name: version}."""
    found = {}
    for line in lines:
        match = PIN.match(line.strip().removeprefix("- "))
        if match:
            found[canonicalize_name(match.group(1))] = match.group(3)
    return found


def constraints(name: str = "constraints.txt") -> dict[str, str]:
    """A lock file's exact pins by canonical name."""
    return pins((ROOT / name).read_text().splitlines())


def yml_pins(name: str) -> dict[str, str]:
    """A conda file's pip pins by canonical name."""
    return pins((ROOT / name).read_text().splitlines())
