"""Test session setup: 8 virtual CPU devices before any test imports JAX."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import pytest

from labkit.core import env

env.setup(cpu_devices=8, mode="cpu")
# The controller's own cache folder for the session (LABKIT_CACHE_DIR: stored compiles,
# accepted XLA flags), passed to the xdist workers, the notebooks' kernels and every child
# process in their environment: a test run starts cold whatever ~/.cache holds, and the
# lessons' second runs (nbval, solutions) reuse the compiles of the first.
SESSION_CACHE = "LABKIT_TEST_SESSION_CACHE"


# Whole-notebook runs under the papermill CLI, each independent of the others: under
# pytest-xdist's loadscope each goes to whichever worker is free, as its own scope. Everything
# else keeps xdist's scopes: a test file's tests on one worker (its fixtures are built once), an
# nbval notebook's cells in order in one kernel.
SPREAD = (
    "test_papermill_cli_exits_0",
    "test_solution_papermill_cli_exits_0",
    "test_papermill_at_preset_small",
)
BROWSER = ("tests/test_hub_browser.py", "tests/test_browser.py")


def _spread(nodeid: str) -> bool:
    return any(f"::{name}[" in nodeid for name in SPREAD)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's loadscope scheduling, with each whole-notebook run a scope of its own."""
    from xdist.scheduler import LoadScopeScheduling

    class NotebookScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid if _spread(nodeid) else super()._split_scope(nodeid)

    return NotebookScheduling(config, log) if config.getvalue("dist") == "loadscope" else None


def _rank(item: pytest.Item) -> int:
    """When a test starts (lowest first; within a rank, files and notebooks keep their order).

    0: each lesson's first run (papermill), which compiles what the compile cache then keeps,
    and the PyTorch tests (in .venv-torch);
    1: the browser tests (three learners' kernels at once); 2: the lessons' second runs
    (nbval), the slower tier (lessons at PRESET small, which reuse the first runs' compiles
    of what the preset does not size) and 3: the solutions, which reuse the first
    runs' compiles; 4: the unit tests, many short scopes that keep both workers busy to the end.
    """
    nodeid = item.nodeid
    if f"::{SPREAD[0]}[" in nodeid or nodeid.startswith("tests/test_torch_suite.py"):
        return 0
    if nodeid.startswith(BROWSER):
        return 1
    if ".ipynb::" in nodeid or f"::{SPREAD[2]}[" in nodeid:
        return 2
    return 3 if f"::{SPREAD[1]}[" in nodeid else 4


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip GPU tests without a GPU; AOT tests are required (make setup installs the plugin)."""
    if not env.nvidia_gpu_present():
        skip = pytest.mark.skip(reason="needs a real NVIDIA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    items.sort(key=_rank)  # stable: each file's and notebook's order is kept


OWN_CACHE = pytest.StashKey[str]()  # the session cache folder this process made


def pytest_configure(config: pytest.Config) -> None:
    """In the controller (not an xdist worker, not a pytest run by a test): a fresh cache
    folder for the whole session."""
    if hasattr(config, "workerinput") or SESSION_CACHE in os.environ:
        return
    folder = tempfile.mkdtemp(prefix="labkit-test-cache-")
    os.environ[SESSION_CACHE] = os.environ["LABKIT_CACHE_DIR"] = folder
    config.stash[OWN_CACHE] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    """The controller removes the cache folder it made; a pytest that a test runs in a
    subprocess (the PyTorch tests) inherits the folder and leaves it to its owner."""
    folder = config.stash.get(OWN_CACHE, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop(SESSION_CACHE, None)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """nbval stops its kernels outright (no exit handlers): remove their scratch folders."""
    env.sweep_scratch()
