"""labkit.lessons.n09_kernels: the checkers (right passes, wrong fails, unanswered is to do)."""

from __future__ import annotations

import jax
import pytest

from labkit.gpt.config import GPTConfig
from labkit.kernels import pallas
from labkit.lessons import n09_kernels as n09


def test_largest_fitting_tile_k() -> None:
    assert n09.largest_fitting_tile_k(**n09.SMEM_EXERCISE) == 64  # 229376 of 232448 bytes
    assert pallas.matmul_smem_bytes(128, 256, 128) > pallas.H100_SMEM_OPTIN
    assert n09.largest_fitting_tile_k(64, 64, 2, 2, 4) == 256  # 512 x 256 + 16384 bytes


def test_check_tile_k() -> None:
    assert n09.check_tile_k(64).passed
    wrong = n09.check_tile_k(128)
    assert not wrong.passed and wrong.attempted and "327680" in wrong.message
    assert not n09.check_tile_k("big").passed
    assert not n09.check_tile_k(...).attempted


def test_check_score_bytes() -> None:
    small = GPTConfig.preset("small")
    assert n09.check_score_bytes(8 * 4 * 128 * 128 * 2, small, 8).passed
    assert not n09.check_score_bytes(8 * 4 * 128 * 128 * 4, small, 8).passed
    assert not n09.check_score_bytes("many", small, 8).passed
    assert not n09.check_score_bytes(None, small, 8).attempted


def test_check_blocks_visited() -> None:
    assert n09.check_blocks_visited(136).passed  # 1 + 2 + ... + 16
    wrong = n09.check_blocks_visited(256)
    assert not wrong.passed and "diagonal" in wrong.message
    assert not n09.check_blocks_visited(...).attempted


def test_compile_attention_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown attention"):
        n09.compile_attention("magic", None, None, None)


def test_attention_inputs_shapes() -> None:
    q, k, v = n09.attention_inputs(GPTConfig.preset("base"), 1, seq=256)
    assert q.shape == k.shape == v.shape == (1, 256, 12, 64) and str(q.dtype) == "bfloat16"


def test_b200_matmul_in_a_fresh_process_is_refused_by_ptxas() -> None:
    said = n09.b200_matmul_in_fresh_process()  # python -m labkit.lessons.n09_kernels b200
    assert "wgmma" in said and "sm_100a" in said and said.startswith("JaxRuntimeError: ")


def test_only_a_hopper_times_the_kit_kernel() -> None:
    """wgmma is sm_90's alone: an A100 (sm_80) and a B200 (sm_100, where ptxas refuses it)
    time every attention but the kit's flash kernel; without cuDNN's wheel, cuDNN's is left
    out too, and left_out says why."""
    assert list(n09.attention_variants((9, 0))) == list(n09.ATTENTION)
    for capability in ((8, 0), (10, 0), (12, 0)):
        variants = n09.attention_variants(capability)
        assert set(n09.ATTENTION) - set(variants) == {"kit flash (Mosaic GPU)"}
        assert "wgmma" in n09.left_out(capability)["kit flash (Mosaic GPU)"]
    no_cudnn = n09.attention_variants((9, 0), cudnn=False)
    assert set(n09.ATTENTION) - set(no_cudnn) == {"cuDNN fused"}
    assert set(n09.left_out((10, 0), cudnn=False)) == {"kit flash (Mosaic GPU)", "cuDNN fused"}
    assert n09.left_out((9, 0)) == {}


def test_a_b200_compile_reuses_a_kernel_assembled_for_the_h100() -> None:
    """In one process, once an H100 compile has assembled a Mosaic GPU kernel (sm_90a), a
    B200 compile of the same kernel succeeds without ptxas: jaxlib hands it that kernel; a
    kernel not assembled before goes to ptxas for sm_100a, which refuses wgmma. (The H100
    compile comes first: after a first B200 compile, H100 kernels fail too; see
    tests/test_kernels.py.)"""
    import jax.numpy as jnp

    from labkit.kernels import gpu_code
    from labkit.xla.aot import abstract, h100_mesh

    x, y = jnp.zeros((384, 128), jnp.bfloat16), jnp.zeros((128, 128), jnp.bfloat16)
    mesh = h100_mesh((1,), ("x",))
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        h100 = gpu_code.mosaic_code(pallas.matmul, abstract(x, mesh), abstract(y, mesh))
    assert h100.ptxas_targets() == ["sm_90a"]
    assert n09.b200_matmul_here(x, y) == n09.REUSED
    refused = n09.b200_matmul_here(jnp.zeros((640, 128), jnp.bfloat16), y)
    assert "wgmma" in refused and "sm_100a" in refused, refused[:200]


def test_tiles_fit_prediction() -> None:
    assert n09.check_tiles_fit("no").passed and n09.check_tiles_fit(False).passed
    assert n09.check_tiles_fit("yes", 128, 128, 64).passed
    assert "answer one of" in n09.check_tiles_fit("maybe").message


def test_pipeline_depth_with_a_fake_compile() -> None:
    def compile_kernel(kwargs: dict[str, int]) -> None:  # shared memory as Mosaic GPU counts it
        need = pallas.matmul_smem_bytes(
            kwargs["tile_m"], kwargs["tile_n"], kwargs["tile_k"], steps=kwargs["steps"]
        )
        if need > pallas.H100_SMEM_OPTIN:
            raise ValueError("exceeds available shared memory")

    right = {**n09.PIPELINE_EXERCISE, "steps": 4}
    assert n09.check_pipeline_depth(right, compile_kernel).passed
    assert not n09.check_pipeline_depth({**right, "steps": 3}, compile_kernel).passed
    assert not n09.check_pipeline_depth({**right, "steps": 5}, compile_kernel).passed
    assert "give a dict" in n09.check_pipeline_depth({"steps": 4}, compile_kernel).message
    assert not n09.check_pipeline_depth(...).attempted
