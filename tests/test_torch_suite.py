"""The PyTorch tests (marked ``torch``), run in .venv-torch from the main session.

PyTorch lives in an environment of its own (``make setup-torch``), so its tests run under that
environment's Python. Run from here, they are one more scope for pytest-xdist, beside the
notebooks, instead of a second pytest run after the first; they share the session's cache
folder (LABKIT_CACHE_DIR), and their output is shown when they fail.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TORCH_PYTHON = ROOT / ".venv-torch" / "bin" / "python"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is not None,
    reason="this Python has torch: run its tests directly (pytest -m torch)",
)


def test_the_pytorch_tests_pass_in_their_own_environment() -> None:
    if not TORCH_PYTHON.exists():
        pytest.skip("no .venv-torch: run `make setup-torch` (make test builds it first)")
    cmd = [str(TORCH_PYTHON), "-m", "pytest", "tests", "-m", "torch", "-q"]
    cmd += ["-p", "no:cacheprovider"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200, check=False)
    summary = done.stdout.strip().splitlines()[-1:] or ["(no output)"]
    print(f".venv-torch: {summary[0]}")
    assert done.returncode == 0, f"{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    assert " passed" in summary[0] and " failed" not in summary[0], summary[0]
