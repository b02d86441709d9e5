"""tools/find-python: finds a Python >= 3.12 by itself, or says how to get one."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "find-python"


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60)


def test_finds_a_new_enough_python() -> None:
    out = _run(dict(os.environ))
    assert out.returncode == 0, out.stderr
    version = subprocess.run(
        [out.stdout.strip(), "-c", "import sys; print(sys.version_info >= (3, 12))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert version.stdout.strip() == "True"


def test_explicit_python_wins(tmp_path: Path) -> None:
    import sys

    out = _run({**os.environ, "PYTHON": sys.executable})
    assert out.stdout.strip() == sys.executable


def test_no_python_says_how_to_install(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    old = fake / "python3"
    old.write_text("#!/bin/sh\nexit 1\n")  # a Python that is too old: fails the check
    old.chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path)}
    out = _run(env)
    assert out.returncode == 1
    assert "needs Python >= 3.12" in out.stderr and "pyenv install 3.12" in out.stderr
