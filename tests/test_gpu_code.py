"""labkit.kernels.gpu_code: the tensor-core instructions of compiled kernels, read without a GPU."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from labkit.kernels import gpu_code, pallas
from labkit.xla.aot import abstract, h100_mesh

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
