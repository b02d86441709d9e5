"""labkit.runtime.pjrt_capi: the PJRT C API driven with ctypes, on a third-party CPU plugin.

jaxlib 0.12 links its CPU client in without a PJRT C API (no library exports GetPjrtApi and
``get_pjrt_plugin("cpu")`` is NOT_FOUND), so the client is tested on the pinned plugin
``fastatomstruct-xla-cpu``, and on the CUDA plugin for a compile with no GPU.
"""

from __future__ import annotations

import ctypes
import tempfile
from pathlib import Path

import numpy as np
import pytest

from labkit.runtime import pjrt, pjrt_capi
from labkit.xla.aot import H100_SXM_TARGET

LIBRARY = pjrt.plugin_library("fastatomstruct_xla_cpu", load=False)
needs_plugin = pytest.mark.skipif(
    LIBRARY is None, reason="fastatomstruct-xla-cpu is not installed: run `make setup`"
)
ADD = b"""
func.func @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>, %n: tensor<i32>)
    -> (tensor<2x3xf32>, tensor<i32>) {
  %0 = stablehlo.add %a, %b : tensor<2x3xf32>
  %1 = stablehlo.multiply %n, %n : tensor<i32>
  return %0, %1 : tensor<2x3xf32>, tensor<i32>
}
"""


def test_table_offsets_follow_the_header() -> None:
    assert pjrt_capi.FUNCTIONS[0] == "PJRT_Error_Destroy" and len(set(pjrt_capi.FUNCTIONS)) == 90
    assert pjrt_capi.offset_of("PJRT_Client_Create") == 40 + 8 * 10
    assert pjrt_capi.offset_of("PJRT_LoadedExecutable_Execute") == 40 + 8 * 55
    assert pjrt_capi.offset_of("PJRT_Compile") == 40 + 8 * 89
    with pytest.raises(KeyError, match=r"not in labkit\.runtime\.pjrt_capi\.FUNCTIONS"):
        pjrt_capi.offset_of("PJRT_Nothing")


def test_compile_options_are_a_compile_options_proto() -> None:
    from jax._src.lib import xla_client

    parsed = xla_client.CompileOptions.ParseFromString(pjrt_capi.compile_options(1, 4))
    assert (parsed.num_replicas, parsed.num_partitions) == (1, 4)
    assert pjrt_capi.compile_options() == b"\x1a\x04\x20\x01\x28\x01"


@needs_plugin
def test_a_hand_written_module_runs_and_everything_is_destroyed() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = pjrt_capi.run_program(LIBRARY, ADD, [a, a * 10, np.int32(7)], {"cpu_device_count": 1})
    total, square = result["outputs"]
    np.testing.assert_array_equal(total, a * 11)
    assert square.dtype == np.int32 and int(square) == 49
    assert result["devices"] == 1 and result["platform"].startswith("cpu")
    assert result["attributes"]["stablehlo_current_version"][0] == 1
    calls = pjrt_capi.calls(result["trace"])
    assert calls["Client_Create"] == calls["Client_Destroy"] == 1
    assert calls["Client_Compile"] == calls["LoadedExecutable_Destroy"] == 1
    assert calls["Buffer_Destroy"] == calls["Client_BufferFromHostBuffer"] + 2  # 3 in, 2 out
    assert calls["Event_Await"] == calls["Event_Destroy"]


@needs_plugin
def test_plugin_errors_carry_the_function_code_and_message() -> None:
    with pytest.raises(pjrt_capi.PjrtError, match=r"PJRT_Client_Compile failed: [A-Z_]+: "):
        pjrt_capi.run_program(LIBRARY, b"this is not MLIR", [], {"cpu_device_count": 1})
    with pytest.raises(pjrt.PluginError, match="does not exist"):
        pjrt_capi.Api("/no/such/plugin.so")


@needs_plugin
def test_a_function_past_the_table_is_a_clear_error() -> None:
    api = pjrt_capi.Api(LIBRARY)
    assert api.version >= pjrt.ApiVersion(0, 106) and api.num_functions >= 90
    api.struct_size = pjrt_capi.offset_of("PJRT_Compile")  # pretend an older, shorter table
    with pytest.raises(pjrt.PluginError, match="has no PJRT_Compile"):
        api.function("PJRT_Compile")
    assert ctypes.sizeof(pjrt_capi.ARGS["PJRT_Client_Create"]) == 11 * 8


@needs_plugin
def test_a_jax_export_runs_in_a_process_without_jax() -> None:
    import jax
    import jax.numpy as jnp

    def f(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jnp.tanh(x @ w).sum(axis=0), x * 2  # (4,), (8, 16)

    x = np.random.default_rng(0).normal(size=(8, 16)).astype(np.float32)
    w = np.random.default_rng(1).normal(size=(16, 4)).astype(np.float32)
    code = jax.export.export(jax.jit(f), platforms=("cpu",))(x, w).mlir_module_serialized
    before = set(Path(tempfile.gettempdir()).glob("labkit-capi-*"))
    result = pjrt_capi.run_in_fresh_process("run", LIBRARY, code, [x, w], {"cpu_device_count": 1})
    assert result["error"] is None and result["jax_imported"] is False
    for ours, theirs in zip(result["outputs"], f(x, w), strict=True):
        np.testing.assert_allclose(ours, np.asarray(theirs), rtol=1e-6, atol=1e-6)
    assert set(Path(tempfile.gettempdir()).glob("labkit-capi-*")) == before  # folder removed
    assert pjrt.child_processes() == []  # the child has exited


def test_the_child_reports_errors_as_json() -> None:
    result = pjrt_capi.run_in_fresh_process("run", "/no/such/plugin.so", b"", [])
    assert "does not exist" in result["error"]
    with pytest.raises(ValueError, match="'run' or 'topology'"):
        pjrt_capi.run_in_fresh_process("execute", "/x.so", b"")


@pytest.mark.aot
def test_the_cuda_plugin_compiles_for_a_topology_without_a_gpu() -> None:
    import jax
    import jax.numpy as jnp

    cuda = next((p for p in pjrt.installed_plugins() if p.library and "cuda" in p.name), None)
    if cuda is None or cuda.library is None:
        pytest.skip("jax-cuda12-plugin is not installed")
    x = jax.ShapeDtypeStruct((128, 256), jnp.float32)
    w = jax.ShapeDtypeStruct((256, 512), jnp.float32)
    exported = jax.export.export(jax.jit(lambda x, w: jnp.tanh(x @ w)), platforms=("cuda",))(x, w)
    options = {"target_config": H100_SXM_TARGET, "topology": "1x1x1"}
    result = pjrt_capi.run_in_fresh_process(
        "topology", cuda.library, exported.mlir_module_serialized, options=options
    )
    assert result["error"] is None and result["platform"] == "cuda", result
    assert result["outputs"] == 1 and "sm_90a" in result["targets"]
    calls = pjrt_capi.calls(result["trace"])
    assert calls["Compile"] == calls["Executable_Destroy"] == 1
    assert "Client_Create" not in calls  # no client, no GPU: a topology is enough
