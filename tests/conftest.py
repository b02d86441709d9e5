"""Test session setup: 8 virtual CPU devices before any test imports JAX."""

from __future__ import annotations

import pytest

from labkit.core import env

env.setup(cpu_devices=8, mode="cpu")


def _aot_available() -> bool:
    from labkit.xla.aot import AotUnavailable, check_available

    try:
        check_available()
    except AotUnavailable:
        return False
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip GPU tests without a GPU; AOT tests are required (make setup installs the plugin)."""
    if not env.nvidia_gpu_present():
        skip = pytest.mark.skip(reason="needs a real NVIDIA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """nbval stops its kernels outright (no exit handlers): remove their scratch folders."""
    env.sweep_scratch()
