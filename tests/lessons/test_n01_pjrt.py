"""labkit.lessons.n01_pjrt: checkers, kernel counting, the bug reproducer, the cache child."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from labkit.lessons import n01_pjrt as lesson
from labkit.runtime import pjrt

needs_cxx = pytest.mark.skipif(pjrt.find_cxx() is None, reason="no C++ compiler")

CPU_LIKE = """HloModule m, is_scheduled=true

%f1 (p: f32[4,4]) -> f32[4,4] {
  %p = f32[4,4]{1,0} parameter(0)
  ROOT %d = f32[4,4]{1,0} dot(%p, %p), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: f32[4,4]) -> f32[4,4] {
  %a = f32[4,4]{1,0} parameter(0)
  %x = f32[4,4]{1,0} fusion(%a), kind=kCustom, calls=%f1, backend_config=YNN
  ROOT %y = f32[4,4]{1,0} fusion(%x), kind=kCustom, calls=%f1, backend_config=YNN
}
""".replace("YNN", '{"fusion_config":{"kind":"__ynn_fusion"}}')

GPU_LIKE = """HloModule m, is_scheduled=true

ENTRY %main (a: f32[4,4]) -> f32[4,4] {
  %a = f32[4,4]{1,0} parameter(0)
  %c = (f32[4,4]{1,0}, s8[64]{0}) custom-call(%a, %a), custom_call_target="__cublas$lt$matmul"
  ROOT %g = f32[4,4]{1,0} get-tuple-element(%c), index=0
}
"""


def test_kernel_kinds_reads_cpu_and_gpu_kernels() -> None:
    assert lesson.kernel_kinds(CPU_LIKE) == {"__ynn_fusion": 2}
    assert lesson.kernel_kinds(GPU_LIKE) == {"__cublas$lt$matmul": 1}
    assert lesson.gemm_kernels(GPU_LIKE) == 1 and lesson.gemm_kernels(CPU_LIKE) == 0
    facts = lesson.structure(CPU_LIKE)
    assert facts["library kernels"] == ["__ynn_fusion"] and facts["collectives"] == {}


def test_placement_checker() -> None:
    values = jnp.arange(8.0)
    assert lesson.check_placement(jax.device_put(values, jax.devices()[3]), values).passed
    wrong = lesson.check_placement(values, values)  # still on device 0
    assert not wrong.passed and wrong.attempted and "device_put" in wrong.message
    assert not lesson.check_placement(jax.device_put(values + 1, jax.devices()[3]), values).passed
    assert not lesson.check_placement([1, 2], values).passed
    assert not lesson.check_placement(..., values).attempted


def test_undonated_bytes_checker() -> None:
    w, x = jnp.ones((64, 64)), jnp.ones((8, 64))
    compiled = jax.jit(lambda w, x: w + x.sum(), donate_argnums=0).lower(w, x).compile()
    assert lesson.check_undonated_bytes(x.nbytes, compiled).passed
    wrong = lesson.check_undonated_bytes(w.nbytes, compiled)
    assert not wrong.passed and "alias_size_in_bytes" in wrong.message
    assert not lesson.check_undonated_bytes(None, compiled).attempted


def test_cpu_library_kernels_checker() -> None:
    assert lesson.check_cpu_library_kernels(2, CPU_LIKE).passed
    assert not lesson.check_cpu_library_kernels(1, CPU_LIKE).passed
    assert not lesson.check_cpu_library_kernels("two", CPU_LIKE).passed
    assert not lesson.check_cpu_library_kernels(..., CPU_LIKE).attempted


def test_persistent_cache_hit_in_a_fresh_process(tmp_path: Path) -> None:
    first = pjrt.compile_in_fresh_process("labkit.lessons.n01_pjrt", tmp_path)
    second = pjrt.compile_in_fresh_process("labkit.lessons.n01_pjrt", tmp_path)
    assert first["misses"] >= 1 and first["hits"] == 0
    assert second["hits"] >= 1 and second["misses"] == 0
    names = {p.name.split("-")[0] for p in tmp_path.iterdir()}
    assert {"jit_mlp_train_step", "jit_scale_shift"} <= names
    # a deviceless H100 executable is written, but a fresh process cannot load it back
    h100 = first["h100"], second["h100"]
    assert h100[0]["misses"] == 1 and h100[1]["misses"] == 1 and h100[1]["hits"] == 0
    assert any("PjRtCompiler must be constructed with a Client" in w for w in h100[1]["warnings"])


def test_reproducer_shows_the_reserialization_bug() -> None:
    """jaxlib 0.12.0.1: a deserialized XLA:CPU executable serializes without its kernels'
    code. When this test fails, jaxlib has fixed the bug: update 01_pjrt's section 6."""
    run = lesson.run_reproducer()
    assert "deserialized: [2. 2. 2. 2.]" in run.stdout and "jaxlib: " in run.stdout
    assert run.sizes is not None and run.sizes[1] < run.sizes[0], run.stdout
    assert run.returncode != 0 and run.missing_function is not None, run.error


def test_reproducer_output_is_read() -> None:
    printed = "deserialized: [2.]\nserialized 7309 bytes, re-serialized 5944 bytes\n"
    error = "jax.errors.JaxRuntimeError: NOT_FOUND: Function wrapped_sine not found (type id: 1)"
    run = lesson.ReproducerRun(1, printed, error)
    assert run.sizes == (7309, 5944) and run.missing_function == "wrapped_sine"
    fixed = lesson.ReproducerRun(0, "deserialized: [2.]\n", "")
    assert fixed.sizes is None and fixed.missing_function is None


def test_ffi_needs_a_compiler(tmp_path: Path) -> None:
    with pytest.raises(pjrt.CompilerNotFound):
        lesson.build_rms_norm(tmp_path, compiler="/no/such/c++")


@needs_cxx
def test_ffi_custom_call_matches_jax(tmp_path: Path) -> None:
    library = lesson.build_rms_norm(tmp_path, pjrt.find_cxx())
    rms_norm = lesson.register_rms_norm(library, name="labkit_rms_test")
    x = jax.random.normal(jax.random.key(0), (4, 32))  # (rows, features)
    xs = jax.random.normal(jax.random.key(1), (2, 4, 32))  # (batch, rows, features)
    reference = lesson.rms_norm_reference
    np.testing.assert_allclose(rms_norm(x), reference(x), atol=1e-5)
    np.testing.assert_allclose(jax.jit(rms_norm)(x), reference(x), atol=1e-5)
    np.testing.assert_allclose(jax.vmap(rms_norm)(xs), reference(xs), atol=1e-5)
    assert "stablehlo.custom_call @labkit_rms_test" in jax.jit(rms_norm).lower(x).as_text()
    with pytest.raises(jax.errors.JaxRuntimeError, match="Wrong buffer dtype"):
        jax.block_until_ready(rms_norm(x.astype(jnp.bfloat16)))
