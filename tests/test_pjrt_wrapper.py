"""labkit.runtime.pjrt_wrapper: a C++ plugin that forwards every call to another and logs four."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.runtime import pjrt, pjrt_capi, pjrt_wrapper

LIBRARY = pjrt.plugin_library("fastatomstruct_xla_cpu", load=False)
needs_cxx = pytest.mark.skipif(pjrt.find_cxx() is None, reason="no C++ compiler")
needs_plugin = pytest.mark.skipif(LIBRARY is None, reason="fastatomstruct-xla-cpu is missing")

# A fresh JAX process with the wrapper registered as platform "wrapped": one device_put,
# one jitted function run three times.
CHILD = """
import os, sys
os.environ["JAX_PLATFORMS"] = "cpu,wrapped"
from jax._src import xla_bridge
xla_bridge.register_plugin("wrapped", library_path=sys.argv[1], options={"cpu_device_count": 1})
import jax, jax.numpy as jnp, numpy as np
x = jax.device_put(np.arange(8, dtype=np.float32), jax.devices("wrapped")[0])
f = jax.jit(lambda x: jnp.tanh(x) * 2)
for _ in range(3):
    x = f(x)
print(float(np.asarray(x).sum()))  # read back on the host: no other compile
"""


def test_offsets_are_those_of_the_table() -> None:
    assert pjrt_wrapper.offsets() == {
        "OFF_CREATE": 40 + 8 * 10,
        "OFF_COMPILE": 40 + 8 * 20,
        "OFF_EXECUTE": 40 + 8 * 55,
        "OFF_FROM_HOST": 40 + 8 * 22,
    }
    assert all(name in pjrt_capi.FUNCTIONS for name in pjrt_wrapper.LOGGED)


def test_missing_compiler_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(pjrt.CompilerNotFound, match=r"install one .* wrapping PJRT plugin"):
        pjrt_wrapper.build(tmp_path, compiler="/no/such/compiler/g++")


def test_log_and_artifact_readers(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    log.write_text(
        "PJRT_Client_Create\nPJRT_Client_BufferFromHostBuffer\n"
        f"PJRT_Client_Compile 0xa {tmp_path / 'program_0.mlir'}\nPJRT_Client_Compile 0xb -\n"
        "PJRT_LoadedExecutable_Execute 0xa 2\nPJRT_LoadedExecutable_Execute 0xa 2\n"
    )
    seen = pjrt_wrapper.read_log(log)
    assert seen.calls["PJRT_Client_Compile"] == 2 and seen.compiled == ["0xa", "0xb"]
    assert seen.executes == {"0xa": 2} and seen.programs == [tmp_path / "program_0.mlir"]
    assert pjrt_wrapper.read_log(tmp_path / "none.txt").calls == {}
    assert pjrt_wrapper.artifact_version(b"ML\xefR\rStableHLO_v1.16.1\x00...") == (1, 16, 1)
    assert pjrt_wrapper.artifact_version(b"module {}") is None


@needs_cxx
@needs_plugin
def test_the_wrapper_forwards_and_counts(tmp_path: Path) -> None:
    wrapper = pjrt_wrapper.build(tmp_path / "build")
    dump = tmp_path / "dump"
    dump.mkdir()
    env = {**os.environ, **pjrt_wrapper.environment(LIBRARY, tmp_path / "log.txt", dump)}
    env.pop("JAX_PLATFORMS", None)
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(wrapper)], capture_output=True, text=True, env=env
    )
    assert run.returncode == 0, run.stderr[-2000:]
    direct = subprocess.run(
        [sys.executable, "-c", CHILD, str(LIBRARY)], capture_output=True, text=True, env=env
    )
    assert direct.stdout == run.stdout  # the same numbers with the plugin alone
    seen = pjrt_wrapper.read_log(tmp_path / "log.txt")
    assert seen.calls["PJRT_Client_Create"] == 1 and seen.calls["PJRT_Client_Compile"] == 1
    assert seen.executes == {seen.compiled[0]: 3}  # one compile, three executes
    assert seen.calls["PJRT_Client_BufferFromHostBuffer"] >= 1
    artifact = seen.programs[0].read_bytes()
    version = pjrt_wrapper.artifact_version(artifact)
    plugin = pjrt_capi.Api(LIBRARY)
    plugin.initialize()
    assert list(version or ()) == plugin.attributes()["stablehlo_current_version"]  # JAX asked
    assert "stablehlo.tanh" in pjrt_wrapper.artifact_text(artifact)


@needs_cxx
def test_without_a_wrapped_plugin_the_wrapper_says_so(tmp_path: Path) -> None:
    wrapper = pjrt_wrapper.build(tmp_path)
    code = "import sys\nfrom labkit.runtime import pjrt\npjrt.plugin_api_version(sys.argv[1])\n"
    env = {k: v for k, v in os.environ.items() if k != pjrt_wrapper.WRAPPED}
    run = subprocess.run(
        [sys.executable, "-c", code, str(wrapper)], capture_output=True, text=True, env=env
    )
    assert run.returncode != 0 and "set LABKIT_PJRT_WRAPPED" in run.stderr
    assert "returned NULL" in run.stderr
