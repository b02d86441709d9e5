"""labkit.runtime.pjrt: plugin API versions from libraries, clear errors, discovery, the FFI."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from labkit.runtime import pjrt

CC = shutil.which("gcc") or shutil.which("cc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler to build test libraries")
needs_cxx = pytest.mark.skipif(pjrt.find_cxx() is None, reason="no C++ compiler")

# A PJRT_Api header with a chosen version and stub functions that all "succeed" (return no
# error): enough for version checks and for jaxlib's verdict on loading it.
FAKE_PLUGIN = r"""
#include <stddef.h>
typedef void* (*Stub)(void*);
typedef struct { size_t struct_size; void* ext; int major; int minor; } Version;
typedef struct { size_t struct_size; void* ext; Version version; Stub fns[256]; } Api;
static Api api;
static void* ok(void* args) { return NULL; }
const Api* GetPjrtApi(void) {
  api.struct_size = sizeof(Api);
  api.version.struct_size = VERSION_SIZE;
  api.version.major = MAJOR;
  api.version.minor = MINOR;
  for (int i = 0; i < 256; ++i) api.fns[i] = ok;
  return RETURN_NULL ? NULL : &api;
}
"""


def _cc(tmp: Path, name: str, source: str, *defines: str) -> Path:
    """Build ``source`` (C) into ``tmp/name`` as a shared library."""
    assert CC is not None
    src, lib = tmp / f"{name}.c", tmp / name
    src.write_text(source)
    cmd = [CC, "-shared", "-fPIC", *(f"-D{d}" for d in defines), str(src), "-o", str(lib)]
    subprocess.run(cmd, check=True, capture_output=True)
    return lib


def _fake(tmp: Path, major: int, minor: int, null: bool = False, size: int = 24) -> Path:
    name = f"fake_{major}_{minor}_{int(null)}_{size}.so"
    defines = (
        f"MAJOR={major}",
        f"MINOR={minor}",
        f"RETURN_NULL={int(null)}",
        f"VERSION_SIZE={size}",
    )
    return _cc(tmp, name, FAKE_PLUGIN, *defines)


def _cuda() -> pjrt.Plugin | None:
    return next((p for p in pjrt.installed_plugins() if p.library and "cuda" in p.name), None)


# --------------------------------------------------------------------------------------
# Versions


def test_cuda_plugin_version_is_read_from_the_library() -> None:
    cuda = _cuda()
    if cuda is None:
        pytest.skip("jax-cuda12-plugin is not installed")
    assert cuda.module == "jax_plugins.xla_cuda12" and cuda.library is not None
    assert cuda.library.name.endswith(".so") and cuda.dist == "jax-cuda12-pjrt"
    assert cuda.api_version == pjrt.plugin_api_version(cuda.library)
    assert cuda.api_version == pjrt.framework_api_version(cuda.library)  # what jaxlib speaks
    if cuda.dist_version == "0.12.0.1":
        assert cuda.api_version == pjrt.ApiVersion(0, 116)  # checked by hand for this pin


@needs_cc
def test_header_layout_and_framework_version_with_a_fake_plugin(tmp_path: Path) -> None:
    fake = _fake(tmp_path, 7, 1)
    assert pjrt.plugin_api_version(fake) == pjrt.ApiVersion(7, 1)  # the layout we read
    verdict = pjrt.probe(fake)  # jaxlib logs its version, then refuses the major version
    assert verdict.framework.major == 0 and verdict.framework.minor > pjrt.MIN_MINOR
    assert verdict.error is not None and "major version" in verdict.error
    assert "refused" in pjrt.compatibility(pjrt.ApiVersion(7, 1), verdict.framework)


def test_compatibility_in_plain_words() -> None:
    fw = pjrt.ApiVersion(0, 116)
    assert pjrt.compatibility(pjrt.ApiVersion(0, 116), fw, strict=True).startswith("match")
    assert "Mismatched" in pjrt.compatibility(pjrt.ApiVersion(1, 0), fw)
    older = pjrt.compatibility(pjrt.ApiVersion(0, 110), fw)
    assert older.startswith("accepted") and "plugin lacks" in older
    assert "jaxlib lacks" in pjrt.compatibility(pjrt.ApiVersion(0, 120), fw)
    assert "ENABLE_PJRT_COMPATIBILITY=0" in pjrt.compatibility(pjrt.ApiVersion(0, 110), fw, True)
    assert "older than" in pjrt.compatibility(pjrt.ApiVersion(0, pjrt.MIN_MINOR - 1), fw)
    assert str(fw) == "0.116" and pjrt.ApiVersion(0, 99) < fw


@needs_cc
def test_jaxlib_verdicts_on_fake_plugins_match_the_stated_rules(tmp_path: Path) -> None:
    framework = pjrt.probe(_fake(tmp_path, 0, 100)).framework
    older = (framework.major, framework.minor - 16)
    too_old = (framework.major, pjrt.MIN_MINOR - 1)
    cases = [(older, False), (older, True), ((framework.major + 1, 0), False), (too_old, False)]
    for version, strict in cases:
        lib = _fake(tmp_path, *version)
        api = pjrt.plugin_api_version(lib)
        assert api == pjrt.ApiVersion(*version)
        verdict = pjrt.probe(lib, strict=strict)
        refused = pjrt.compatibility(api, framework, strict).startswith("refused")
        assert refused == (verdict.error is not None), (version, strict, verdict.error)
    older_lib = _fake(tmp_path, *older)
    assert "Mismatched PJRT plugin PJRT API version" in (
        pjrt.probe(older_lib, strict=True).error or ""
    )


def test_fix_names_the_exact_jaxlib_version() -> None:
    plugin = pjrt.Plugin("xla_cuda12", "m", "jax-cuda12-pjrt", "0.12.0.1", None, None)
    assert pjrt.fix_for(plugin, "0.12.0.1") is None
    fix = pjrt.fix_for(dataclasses.replace(plugin, dist_version="0.11.0"), "0.12.0.1")
    assert fix is not None and 'pip install "jax-cuda12-pjrt==0.12.0.1"' in fix
    assert pjrt.fix_for(dataclasses.replace(plugin, dist=None), "0.12.0.1") is None


# --------------------------------------------------------------------------------------
# Errors a user meets


def test_missing_library_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(pjrt.PluginError, match="does not exist: check the path"):
        pjrt.plugin_api_version(tmp_path / "nope.so")


def test_non_library_file_is_a_clear_error(tmp_path: Path) -> None:
    text = tmp_path / "plugin.so"
    text.write_text("not a library")
    with pytest.raises(pjrt.PluginError, match="is not a shared library"):
        pjrt.plugin_api_version(text)


@needs_cc
def test_library_without_get_pjrt_api_is_a_clear_error(tmp_path: Path) -> None:
    lib = _cc(tmp_path, "plain.so", "int not_a_plugin(void) { return 1; }\n")
    with pytest.raises(pjrt.PluginError, match="exports no GetPjrtApi"):
        pjrt.plugin_api_version(lib)
    assert not pjrt.exports_pjrt_api(lib) and not pjrt.exports_pjrt_api(tmp_path / "x.so")


@needs_cc
def test_null_api_and_unknown_layout_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(pjrt.PluginError, match="returned NULL"):
        pjrt.plugin_api_version(_fake(tmp_path, 0, 116, null=True))
    with pytest.raises(pjrt.PluginError, match="struct_size"):
        pjrt.plugin_api_version(_fake(tmp_path, 0, 116, size=99))


# --------------------------------------------------------------------------------------
# Clients, devices, plugin packages


def test_backend_and_device_rows_on_cpu() -> None:
    rows = pjrt.backend_rows()
    cpu = next(r for r in rows if r["backend"] == "cpu")
    assert cpu["devices"] == 8 and cpu["c_api"] == "built in"
    devices = pjrt.device_rows()
    assert len(devices) == 8 and devices[0]["memory_stats"] is None  # CPU keeps no stats


def test_written_plugin_package_is_an_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pjrt.write_plugin_package(tmp_path, "labkit_unit", tmp_path / "lib.so")
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=pjrt.GROUP)}
    assert eps["labkit_unit"] == "labkit_unit_plugin"
    found = {p.name: p for p in pjrt.installed_plugins()}
    assert (
        found["labkit_unit"].dist == "labkit_unit_plugin" and found["labkit_unit"].library is None
    )


def test_jax_discovers_a_plugin_package_and_logs_a_broken_one(tmp_path: Path) -> None:
    cuda = _cuda()
    if cuda is None:
        pytest.skip("jax-cuda12-plugin is not installed (its library is the good plugin)")
    (tmp_path / "bad.so").write_text("text")
    pjrt.write_plugin_package(tmp_path, "labkit_good", cuda.library)
    pjrt.write_plugin_package(tmp_path, "labkit_bad", tmp_path / "bad.so")
    found = pjrt.discover([tmp_path])
    assert "labkit_good" in found["factories"] and "labkit_bad" not in found["factories"]
    assert "Discovered entry-point based JAX plugin: labkit_good_plugin" in found["log"]
    assert "labkit_bad_plugin.initialize()" in found["log"] and "Failed to open" in found["log"]


# --------------------------------------------------------------------------------------
# XLA FFI


def test_missing_compiler_is_reported_not_raised_at_lookup(tmp_path: Path) -> None:
    assert pjrt.find_cxx("/no/such/compiler/g++") is None
    with pytest.raises(pjrt.CompilerNotFound, match="no C\\+\\+ compiler found"):
        pjrt.build_ffi("", tmp_path, compiler="/no/such/compiler/g++")


@needs_cxx
def test_ffi_build_errors_show_the_compiler_output(tmp_path: Path) -> None:
    cxx = pjrt.find_cxx()
    assert cxx is not None and pjrt.find_cxx(cxx) == cxx  # an explicit path is honoured
    with pytest.raises(RuntimeError, match="failed"):
        pjrt.build_ffi("this is not C++", tmp_path, "broken", cxx)
    ok = pjrt.build_ffi('#include "xla/ffi/api/ffi.h"\n', tmp_path, "empty", cxx)
    assert ok.name == "libempty.so" and ok.exists()


def test_cached_executables_do_not_reload_after_serialization(tmp_path: Path) -> None:
    """jaxlib 0.12: an XLA:CPU executable that was itself deserialized (here: loaded from
    the persistent cache by a second process) serializes without its kernels' code: the
    bytes load, and the first call fails (NOT_FOUND: Function ... not found). 01_pjrt
    reproduces it with serialize_executable alone; when this test fails, jaxlib fixed it."""
    code = f"""
import jax, jax.numpy as jnp
from jax.experimental import serialize_executable as se
from labkit.runtime import pjrt
pjrt.enable_persistent_cache({str(tmp_path)!r})
exe = jax.jit(lambda x: jnp.where(x > 0, x + 1, x * 2).sum()).lower(jnp.ones(64)).compile()
try:
    print("reloaded", float(se.deserialize_and_load(*se.serialize(exe))(jnp.ones(64))))
except Exception as exc:
    print("fails:", type(exc).__name__, str(exc)[:80])
"""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    first, second = (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        for _ in range(2)
    )
    assert "reloaded 128.0" in first.stdout, first.stderr[-500:]  # compiled: fine
    assert "fails: JaxRuntimeError" in second.stdout and "not found" in second.stdout


# --------------------------------------------------------------------------------------
# A third-party plugin, named without loading it; what this process holds


@needs_cc
def test_probe_reads_both_versions_from_jaxlibs_log(tmp_path: Path) -> None:
    verdict = pjrt.probe(_fake(tmp_path, 0, 100))
    assert verdict.plugin == pjrt.ApiVersion(0, 100) and verdict.framework > verdict.plugin


def test_a_plugin_library_is_named_without_loading_it(tmp_path: Path) -> None:
    library = pjrt.plugin_library("fastatomstruct_xla_cpu", load=False)
    if library is None:
        pytest.skip("fastatomstruct-xla-cpu is not installed")
    assert library.name == "libpjrt_cpu.so"
    assert pjrt.plugin_library("no_such_module_here", load=False) is None
    assert not pjrt.loaded(tmp_path / "never.so")
    assert pjrt.loaded(
        Path(np.__file__).parent / "_core" / "_multiarray_umath.cpython-312-x86_64-linux-gnu.so"
    )
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in pjrt.child_processes()
    finally:
        child.kill()
        child.wait()
    assert child.pid not in pjrt.child_processes()
