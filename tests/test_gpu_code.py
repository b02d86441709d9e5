"""labkit.kernels.gpu_code: the tensor-core instructions of compiled kernels, read without a GPU."""

from __future__ import annotations

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from labkit.kernels import gpu_code, pallas
from labkit.xla.aot import abstract, compile_for_gpu, h100_mesh

NVVM = (
    '%1 = "nvvm.mma.sync"(%a, %b) <{layoutA = #nvvm.mma_layout<row>, multiplicandAPtxType = '
    "#nvvm.mma_type<f16>, multiplicandBPtxType = #nvvm.mma_type<f16>, shape = #nvvm.shape<m = 16, "
    "n = 8, k = 16>}> : (vector<2xf16>) -> f32\n"
)
PTX = "wgmma.mma_async.sync.aligned.m64n128k32.f32.e5m2.e5m2 {%f1}, %rd1;\n// mma.sync is named\n"


def test_mma_instructions_from_nvvm_and_ptx() -> None:
    assert gpu_code.mma_instructions(NVVM) == {"mma.sync m16n8k16 f16 x f16": 1}
    found = gpu_code.mma_instructions(PTX * 2)
    assert found == {"wgmma.mma_async.sync.aligned.m64n128k32.f32.e5m2.e5m2": 2}


def test_triton_code_of_xla_gemm_fusion() -> None:
    a = abstract(jax.ShapeDtypeStruct((256, 256), jnp.bfloat16), h100_mesh((1,), ("x",)))
    result, text = gpu_code.triton_code(jnp.dot, a, a)
    assert "__triton_nested_gemm_fusion" in result.hlo
    assert any(name.startswith(("mma.sync", "wgmma")) for name in gpu_code.mma_instructions(text))
    # Left set for the process: after a dump XLA keeps tracing every MLIR diagnostic, and
    # each later compile would run llvm-symbolizer (05: 2 s compiles took 36-73 s).
    assert os.environ.get("LLVM_DISABLE_SYMBOLIZATION") == "1"


def test_mosaic_code_has_wgmma_and_the_ptxas_target() -> None:
    # Shapes no other test compiles: jaxlib keeps every Mosaic kernel it assembled in this
    # process (pytest-xdist runs several test modules in one), and a reused one prints nothing.
    mesh = h100_mesh((1,), ("x",))
    x = abstract(jax.ShapeDtypeStruct((128, 384), jnp.bfloat16), mesh)
    y = abstract(jax.ShapeDtypeStruct((384, 128), jnp.bfloat16), mesh)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        code = gpu_code.mosaic_code(pallas.matmul, x, y)
    assert code.ptxas_targets() == ["sm_90a"]
    assert any(n.startswith("wgmma.mma_async") for n in gpu_code.mma_instructions(code.ptx))
    assert "MOSAIC_GPU_DUMP_PTX" not in os.environ  # restored
    assert os.environ.get("LLVM_DISABLE_SYMBOLIZATION") == "1"  # left set, as by triton_code


LAUNCH = "gemm_fusion_dot_7 grid: [12, 1, 1] threads: [128, 1, 1]  shared_memory: 49536 bytes"
SEQUENCE = f"""001: kCustomKernel [source | next=002 (1) ] {LAUNCH}
002: kCopy [prev=001 (1)  | next=003 (1) ] copy.2
003: kCustomKernel [prev=002 (1)  | sink] {LAUNCH}
"""
METADATA = """thunk_metadata {
  thunk_info {
    profile_annotation: "gemm_fusion_dot.7"
    thunk_id: 1
  }
}
thunk_metadata {
  thunk_info {
    profile_annotation: "gemm_fusion_dot.9"
    thunk_id: 3
  }
}
"""
PTXAS = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'gemm_fusion_dot_7' for 'sm_90a'
ptxas info    : Function properties for gemm_fusion_dot_7
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 90 registers, used 1 barriers, 384 bytes cmem[0]
"""


def test_launches_and_registers_are_read_from_xlas_dumps_and_ptxas() -> None:
    found = gpu_code.launches(SEQUENCE, METADATA)
    # thunk 3 runs fusion gemm_fusion_dot.9 with the kernel of the identical .7
    assert [(x.fusion, x.kernel, x.threads, x.shared_memory) for x in found] == [
        ("gemm_fusion_dot.7", "gemm_fusion_dot_7", 128, 49536),
        ("gemm_fusion_dot.9", "gemm_fusion_dot_7", 128, 49536),
    ]
    assert gpu_code.ptxas_registers(PTXAS) == {"gemm_fusion_dot_7": 90}


def test_gemm_kernels_reports_tiles_code_launch_and_registers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LABKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LABKIT_COMPILE_CACHE", raising=False)
    mesh = h100_mesh((1,), ("x",))
    a = abstract(jax.ShapeDtypeStruct((2048, 1024), jnp.bfloat16), mesh)
    b = abstract(jax.ShapeDtypeStruct((1024, 1536), jnp.bfloat16), mesh)
    reports = {t: gpu_code.gemm_kernels(jnp.matmul, a, b, tiles=t) for t in ("untuned", "rule")}
    (untuned,), (ruled,) = reports["untuned"].gemms, reports["rule"].gemms
    assert untuned.issues == "mma.sync" and untuned.config == "16x8x16, 2 warps, 1 stage"
    assert (untuned.threads, untuned.shared_memory) == (64, 768)
    assert ruled.issues == "wgmma" and ruled.threads == 128
    assert ruled.shared_memory >= (128 + 128) * 64 * 2  # at least one stage of its tiles
    assert untuned.registers and ruled.registers and ruled.registers > untuned.registers
    rows = gpu_code.side_by_side(reports)
    assert rows[0] == {"what": "kernel launches in the program", "untuned": "1", "rule": "1"}
    # stored: the report comes back without a compile, and the plain compile is served
    assert gpu_code.gemm_kernels(jnp.matmul, a, b, tiles="rule") == reports["rule"]
    assert compile_for_gpu(jnp.matmul, a, b, tiles="rule").from_cache


def test_what_an_instruction_multiplies() -> None:
    assert gpu_code.multiplies("wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e5m2") == (
        "e4m3 x e5m2"
    )
    assert gpu_code.multiplies("mma.sync m16n8k16 f16 x f16") == "f16 x f16"
    assert gpu_code.multiplies("tcgen05.mma.cta_group::1.kind::f8f6f4") == "kind::f8f6f4"
    assert gpu_code.is_fp8("wgmma.mma_async.sync.aligned.m64n64k32.f32.e5m2.e5m2")
    assert gpu_code.is_fp8("tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale")
    assert not gpu_code.is_fp8("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16")
    assert not gpu_code.is_fp8("mma.sync m16n8k16 f16 x f16")  # FP8 widened to f16
    assert not gpu_code.is_fp8("tcgen05.mma.cta_group::1.kind::f16")
