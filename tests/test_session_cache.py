"""The test session's cache folder (tests/conftest.py) outlives every pytest a test runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import SESSION_CACHE

ROOT = Path(__file__).resolve().parents[1]


def test_a_pytest_run_by_a_test_leaves_the_session_cache_to_its_owner(tmp_path: Path) -> None:
    """A child pytest (as tests/test_torch_suite.py runs) inherits the folder and must not
    remove it: the lessons' second runs read the first runs' compiles from it."""
    cache = tmp_path / "session-cache"
    (cache / "compiles").mkdir(parents=True)
    (cache / "compiles" / "entry.json.z").write_bytes(b"kept")
    env = {**os.environ, SESSION_CACHE: str(cache), "LABKIT_CACHE_DIR": str(cache)}
    child = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    node = "tests/test_feedback.py::test_check_number_and_integer"
    out = subprocess.run([*child, node], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout + out.stderr
    assert (cache / "compiles" / "entry.json.z").read_bytes() == b"kept"
