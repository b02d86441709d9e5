"""labkit.xla.tiles: GEMM tiles from a stated rule, handed to XLA as autotune results."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jaxlib import xla_client

from labkit.core.mesh import abstract
from labkit.gpt.compile import compile_train_step
from labkit.kernels import gpu_code
from labkit.xla import tiles
from labkit.xla.aot import compile_for_gpu, h100_mesh, kernel_cache_for
from labkit.xla.tiles import GemmFusion, TileConfig


def _gemm(m: int, n: int, k: int, dtype: str = "bf16", batch: int = 1) -> GemmFusion:
    return GemmFusion("gemm", "", batch, m, n, k, dtype, dtype)


def _operands(m: int, n: int, k: int, dtype: object) -> tuple[object, object]:
    mesh = h100_mesh((1,), ("x",))
    a = abstract(jax.ShapeDtypeStruct((m, k), dtype), mesh)
    b = abstract(jax.ShapeDtypeStruct((k, n), dtype), mesh)
    return a, b


def _dot_f32(a: jax.Array, b: jax.Array) -> jax.Array:
    return jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def test_the_rule_gives_what_its_docstring_says() -> None:
    h100 = tiles.device_for("H100 SXM")
    assert h100.sm_count == 132 and h100.shared_memory == 232448
    # a big bf16 GEMM: 128x256 tiles (512 of them fill 132 SMs), 128-byte K tile, 8 warps
    assert tiles.rule(_gemm(4096, 4096, 4096)) == TileConfig(128, 256, 64, 1, 4, 8)
    # the tiny GPT's QKV projection (256x192x64): no tile fills the SMs, so the smallest
    assert tiles.rule(_gemm(256, 192, 64)) == TileConfig(64, 64, 64, 1, 1, 4)
    # FP8: 128 bytes of K are 128 elements; f32 (tf32 on the tensor cores): 32
    assert tiles.rule(_gemm(8192, 8192, 8192, "f8e4m3fn")) == TileConfig(128, 256, 128, 1, 4, 8)
    assert tiles.rule(_gemm(1024, 1024, 1024, "f32")) == TileConfig(64, 64, 32, 1, 4, 4)
    # FP8 with a short K still gets one whole wgmma K step (32)
    assert tiles.rule(_gemm(512, 512, 16, "f8e5m2")).block_k == 32
    # M much larger than N: the wider side goes along M, N is capped at its size
    assert tiles.rule(_gemm(65536, 64, 1024)) == TileConfig(256, 64, 64, 1, 4, 4)


def test_every_rule_config_is_valid_and_wgmma_shaped() -> None:
    sizes, types = (16, 64, 192, 1000, 4096, 16384), ("bf16", "f8e4m3fn", "f32")
    for m, n, k, dtype in itertools.product(sizes, sizes, sizes, types):
        gemm = _gemm(m, n, k, dtype)
        config = tiles.rule(gemm)
        tiles.check_config(config, gemm)  # raises if not
        assert config.wgmma_ready and config.split_k == 1, (gemm, config)


def test_a_bad_config_is_refused_with_what_is_wrong() -> None:
    gemm = _gemm(4096, 4096, 4096)
    with pytest.raises(ValueError, match=r"262144 bytes of shared memory.*232448"):
        tiles.check_config(TileConfig(256, 256, 128, num_stages=2), gemm)
    with pytest.raises(ValueError, match="block_n=96 is not a power of two"):
        tiles.check_config(TileConfig(128, 96, 64), gemm)
    with pytest.raises(ValueError, match="larger than the 64x64 output needs"):
        tiles.check_config(TileConfig(128, 128, 64), _gemm(64, 64, 64))
    tiles.check_config(TileConfig(16, 8, 16, 1, 1, 2), gemm)  # XLA's untuned pick is valid


def test_a_bad_rule_is_refused_before_xla_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tiles, "rule", lambda gemm, device=None: TileConfig(256, 256, 512, 1, 4))
    with pytest.raises(ValueError, match="is not valid for gemm_fusion"):
        compile_for_gpu(_dot_f32, *_operands(1024, 1024, 1024, jnp.bfloat16), tiles="rule")


def test_bf16_gemm_issues_wgmma_with_the_rule_and_mma_sync_untuned() -> None:
    args = _operands(4096, 4096, 4096, jnp.bfloat16)
    ruled, text = gpu_code.triton_code(jnp.matmul, *args, tiles="rule")
    found = gpu_code.mma_instructions(text)
    assert found and all(
        re.fullmatch(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16", name)
        for name in found
    ), found
    assert ruled.tiles == "rule"
    assert set(tiles.compiled_configs(ruled.hlo).values()) == {TileConfig(128, 256, 64, 1, 4, 8)}
    untuned, text = gpu_code.triton_code(jnp.matmul, *args, tiles="untuned")
    assert set(gpu_code.mma_instructions(text)) == {"mma.sync m16n8k16 bf16 x bf16"}
    assert set(tiles.compiled_configs(untuned.hlo).values()) == {TileConfig(16, 8, 16, 1, 1, 2)}


def test_e4m3_gemm_issues_fp8_wgmma_with_the_rule() -> None:
    args = _operands(512, 512, 512, jnp.float8_e4m3fn)
    _, text = gpu_code.triton_code(_dot_f32, *args, tiles="rule")
    found = gpu_code.mma_instructions(text)
    assert found and all(
        name.startswith("wgmma.mma_async") and name.endswith("k32.f32.e4m3.e4m3") for name in found
    ), found


def test_every_gemm_fusion_of_the_tiny_gpt_step_gets_the_rules_config() -> None:
    result = compile_train_step("tiny", "dp", tiles="rule")
    configs = tiles.compiled_configs(result.hlo)
    gemms = tiles.compiled_gemms(result.hlo)
    assert len(gemms) == len(configs) > 20  # every Triton GEMM fusion, each with a config
    for gemm in gemms:
        want, have = tiles.rule(gemm), configs[gemm.name]
        # the tile reads in the fusion result's order: a bitcast of the dot may swap its sides
        assert {have.block_m, have.block_n} == {want.block_m, want.block_n}, gemm.describe()
        assert (have.block_k, have.num_warps, have.num_stages) == (
            want.block_k,
            want.num_warps,
            want.num_stages,
        ), gemm.describe()


def test_keys_files_and_results_are_xlas_formats() -> None:
    device = tiles.device_for("NVIDIA H100 80GB HBM3")
    assert device.model == (
        "CUDA: 9.0, Cores: 132, GPU clock: 1.98 GHz, Memory bandwidth: 3350 GB/s, "
        "L2 cache: 50 MB, DNN version: 0.0.0"
    )
    assert "GPU clock: 1.965 GHz" in tiles.device_for("B200").model
    assert "L2 cache: 126.5 MB" in tiles.device_for("B200").model
    # the file name XLA looked for, for a 1024^3 bf16 dot (read from its cache-miss log)
    key_hlo = (
        "{\n  tmp_0 = bf16[1024,1024]{1,0} parameter(0)\n  tmp_1 = bf16[1024,1024]{1,0} "
        "parameter(1)\n  ROOT tmp_2 = bf16[1024,1024]{1,0} dot(bf16[1024,1024]{1,0} tmp_0, "
        "bf16[1024,1024]{1,0} tmp_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}"
    )
    assert tiles.cache_file_name(device, key_hlo) == (
        "Lo2Gz5w9ZN5yKmck5XtjzgrP2E28irJteGWmUvmYyDo.textproto"
    )
    gemm = GemmFusion("gemm_fusion_dot", key_hlo, 1, 1024, 1024, 1024, "bf16", "bf16")
    results = tiles.autotune_results(device, {gemm: TileConfig(64, 64, 64, 1, 4, 4)})
    assert results.startswith("version: 3\nresults {")
    assert "block_m: 64 block_n: 64 block_k: 64 split_k: 1 num_stages: 4" in results
    assert "version: 56" in results and '"CUDA: 9.0, Cores: 132' in results


def test_the_key_text_is_xlas_canonical_computation() -> None:
    fusion = (
        "ROOT %gemm_fusion_dot = f32[64,64]{1,0} fusion(%n, %later), kind=kCustom, calls=%fused, "
        'backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}'
    )
    module = """HloModule m

%fused (p0: f32[64,64], p1: f32[64,64]) -> f32[64,64] {
  %p0 = f32[64,64]{1,0} parameter(0)
  %c = f32[] constant(0.25)
  %one = f32[] constant(1)
  %i = s32[] constant(7)
  %b = f32[64,64]{1,0} broadcast(%c), dimensions={}
  %m = f32[64,64]{1,0} multiply(%p0, %b)
  %p1 = f32[64,64]{1,0} parameter(1)
  ROOT %d = f32[64,64]{1,0} dot(%m, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: f32[64,64], b: f32[64,64]) -> f32[64,64] {
  %a = f32[64,64]{1,0} parameter(0)
  %n = f32[64,64]{1,0} negate(%a), control-predecessors={%later}
  %later = f32[64,64]{1,0} parameter(1)
  FUSION
}
""".replace("FUSION", fusion)
    with pytest.raises(Exception, match="not defined"):  # jaxlib reads no forward control edge
        xla_client.hlo.hlo_module_from_text(module)
    (gemm,) = tiles.gemm_fusions(module)  # so the fusion is read on its own
    assert gemm.describe() == "gemm_fusion_dot (f32 x f32, 64x64x64)"
    lines = gemm.key_hlo.splitlines()
    assert lines[0] == "{" and lines[-1] == "}" and lines[1].startswith("  tmp_0 = ")
    assert "f32[] constant({...})" in gemm.key_hlo  # 0.25: not an essential constant
    assert "f32[] constant(1)" in gemm.key_hlo and "s32[] constant(7)" in gemm.key_hlo


def test_a_rule_compile_is_cached_apart_from_the_untuned_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LABKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LABKIT_COMPILE_CACHE", raising=False)
    args = _operands(256, 256, 256, jnp.bfloat16)
    first = compile_for_gpu(jnp.matmul, *args, tiles="rule")
    again = compile_for_gpu(jnp.matmul, *args, tiles="rule")
    untuned = compile_for_gpu(jnp.matmul, *args, tiles="untuned")
    assert again.from_cache and again.hlo == first.hlo and again.tiles == "rule"
    assert not untuned.from_cache and untuned.hlo != first.hlo
    assert len(list((tmp_path / "compiles").glob("*.json.z"))) == 2
    assert tiles.cache_marker("untuned") == {}
    assert tiles.cache_marker("rule")["labkit_tiles"].startswith("rule:")


def test_labkit_tiles_names_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LABKIT_TILES", raising=False)
    assert tiles.default_tiles() == "rule"  # the kit's H100 program is the tuned-like one
    monkeypatch.setenv("LABKIT_TILES", "untuned")
    assert tiles.default_tiles() == "untuned"
    assert "not timed on a GPU" in tiles.label("rule")
    monkeypatch.setenv("LABKIT_TILES", "tuned")
    with pytest.raises(ValueError, match="LABKIT_TILES must be one of untuned, rule"):
        tiles.default_tiles()


def test_a_process_keeps_the_first_config_of_a_fusion(monkeypatch: pytest.MonkeyPatch) -> None:
    args = _operands(384, 384, 384, jnp.bfloat16)
    compile_for_gpu(jnp.matmul, *args, tiles="rule", cache=False)
    monkeypatch.setattr(tiles, "rule", lambda gemm, device=None: TileConfig(64, 128, 64, 1, 2))
    with pytest.raises(tiles.TilesNotTaken, match="keeps the first config a process reads"):
        compile_for_gpu(jnp.matmul, *args, tiles="rule", cache=False)


def test_compiled_configs_read_the_two_tiled_sides_in_any_result_order() -> None:
    level = (
        '{"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion",'
        '"block_level_fusion_config":{"num_warps":"4","output_tiles":[{"sizes":["64","1","128"]}],'
        '"num_ctas":1,"num_stages":3}}}'
    )
    hlo = """HloModule m, is_scheduled=true

%gemm (p0: bf16[12,1024,64], p1: bf16[12,64,256]) -> bf16[1024,12,256] {
  %p0 = bf16[12,1024,64]{2,1,0} parameter(0)
  %p1 = bf16[12,64,256]{2,1,0} parameter(1)
  %d = bf16[12,1024,256]{2,1,0} dot(%p0, %p1), DIMS, backend_config={"sizes":["64"]}
  ROOT %t = bf16[1024,12,256]{2,1,0} transpose(%d), dimensions={1,0,2}
}

ENTRY %main (a: bf16[12,1024,64], b: bf16[12,64,256]) -> bf16[1024,12,256] {
  %a = bf16[12,1024,64]{2,1,0} parameter(0)
  %b = bf16[12,64,256]{2,1,0} parameter(1)
  ROOT %f = bf16[1024,12,256]{2,1,0} fusion(%a, %b), kind=kCustom, calls=%gemm, backend_config=LEVEL
}
""".replace("LEVEL", level)
    dims = "lhs_batch_dims={0}, lhs_contracting_dims={2}, "
    dims += "rhs_batch_dims={0}, rhs_contracting_dims={1}"
    hlo = hlo.replace("DIMS", dims)
    assert tiles.compiled_configs(hlo) == {"f": TileConfig(64, 128, 64, 1, 3, 4)}
    (gemm,) = tiles.compiled_gemms(hlo)
    assert (gemm.batch, gemm.m, gemm.n, gemm.k, gemm.lhs) == (12, 1024, 256, 64, "bf16")


def test_a_program_without_triton_gemms_compiles_as_untuned_under_the_rule() -> None:
    mesh = h100_mesh((1,), ("x",))
    x = abstract(jax.ShapeDtypeStruct((256, 256), jnp.float32), mesh)
    ruled = compile_for_gpu(jnp.sin, x, tiles="rule", cache=False)
    untuned = compile_for_gpu(jnp.sin, x, tiles="untuned", cache=False)
    assert ruled.tiles == "rule" and ruled.hlo == untuned.hlo


def _gemm_shared_memory(args: tuple[object, object], options: dict[str, str], dump: Path) -> int:
    """Shared memory of the one GEMM kernel a rule compile launches (XLA's thunk sequence)."""
    dumps = {**options, "xla_dump_to": str(dump)}
    compile_for_gpu(jnp.matmul, *args, compiler_options=dumps, tiles="rule")
    sequence = next(dump.glob("*.thunk_sequence.txt")).read_text()
    metadata = next(dump.glob("*.thunk_metadata.txt")).read_text()
    (launch,) = [x for x in gpu_code.launches(sequence, metadata) if "gemm" in x.kernel]
    return launch.shared_memory


def test_a_rule_compile_keeps_its_own_kernel_cache_file(tmp_path: Path) -> None:
    named = {"xla_gpu_kernel_cache_file": str(tmp_path / "a.bin")}
    assert kernel_cache_for(named, "untuned") == named
    assert kernel_cache_for(named, "rule") == {
        "xla_gpu_kernel_cache_file": f"{tmp_path}/a.bin.rule"
    }
    assert kernel_cache_for({}, "rule") == {}
    args = _operands(640, 640, 640, jnp.bfloat16)
    untuned = TileConfig(16, 8, 16, 1, 1, 2).shared_memory(16)  # 768 B
    # Why: XLA keys a cached kernel without its tiles. A rule compile reading the file an
    # untuned compile wrote launches the untuned kernel (its shared memory), not the rule's.
    shared = {"xla_gpu_kernel_cache_file": str(tmp_path / "b.bin.rule")}
    compile_for_gpu(jnp.matmul, *args, compiler_options=shared, tiles="untuned", cache=False)
    stale = {"xla_gpu_kernel_cache_file": str(tmp_path / "b.bin")}  # read as b.bin.rule
    assert _gemm_shared_memory(args, stale, tmp_path / "stale") == untuned
    # compile_for_gpu keeps a file per tiles, so the same names give the rule's kernel
    compile_for_gpu(jnp.matmul, *args, compiler_options=named, tiles="untuned", cache=False)
    assert _gemm_shared_memory(args, named, tmp_path / "kept") > 16 * untuned
