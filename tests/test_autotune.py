"""labkit.xla.autotune: XLA's autotune results from a GPU, rewritten for deviceless loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.xla import autotune, tiles
from labkit.xla.tiles import GemmFusion, TileConfig

H100 = tiles.device_for("H100 SXM")
REAL = "CUDA: 9.0, Cores: 132, GPU clock: 1.98 GHz, Memory bandwidth: 3352 GB/s, L2 cache: 50 MB, DNN version: 9.10.2"  # noqa: E501 (a real H100's key string, as XLA writes it)
KEY_HLO = 'fused_computation {\n  p0 = bf16[64,64]{1,0} parameter(0), metadata={op_name="a\\"b"}\n}'
GEMM = GemmFusion("gemm_fusion_dot.1", KEY_HLO, 1, 64, 64, 64, "bf16", "bf16")
CONFIG = TileConfig(64, 64, 64, 1, 2, 4)


def real_dump() -> str:
    """What a GPU run dumps: the rule's writer's format, with the real GPU's device string."""
    return tiles.autotune_results(H100, {GEMM: CONFIG}).replace(H100.model, REAL)


def test_a_dump_is_rewritten_to_the_deviceless_device(tmp_path: Path) -> None:
    text, originals = autotune.rewrite_device(real_dump(), "H100 SXM")
    assert originals == [REAL] and REAL not in text
    (entry,) = autotune.parse_results(text)
    assert (entry.device, entry.hlo) == (H100.model, KEY_HLO)  # escapes undone
    assert autotune.config_of(entry) == CONFIG
    # the folder a deviceless compile loads holds what the rule's own writer writes
    (written,) = autotune.write_folder([entry], tmp_path / "ours", "H100 SXM")
    tiles.write_cache_folder(tmp_path / "rule", H100, {GEMM: CONFIG})
    (rules,) = (tmp_path / "rule").iterdir()
    assert written.name == rules.name and written.read_text() == rules.read_text()


def test_entries_for_another_device_are_refused(tmp_path: Path) -> None:
    entries = autotune.parse_results(real_dump())
    with pytest.raises(ValueError, match="rewrite them first"):
        autotune.write_folder(entries, tmp_path, "H100 SXM")


def test_what_is_not_xlas_format_is_refused() -> None:
    with pytest.raises(ValueError, match="no results blocks"):
        autotune.parse_results("version: 3\n")
    with pytest.raises(ValueError, match="without device"):
        autotune.parse_results('results {\n  hlo: "x"\n  result { triton { block_m: 16 } }\n}\n')
    gemm = real_dump().replace(CONFIG.textproto(), "gemm { algorithm: 7 }")
    (entry,) = autotune.parse_results(gemm)
    assert autotune.config_of(entry) is None  # XLA picked cuBLAS: no tile config


def test_stored_results_come_back_with_their_record(tmp_path: Path) -> None:
    text, originals = autotune.rewrite_device(real_dump(), "H100 SXM")
    record = autotune.DumpRecord(
        "tiny", "H100 SXM", "NVIDIA H100 80GB HBM3", "570.1", "0.12", originals, 1, 1
    )
    results, meta = autotune.write_stored(text, record, tmp_path)
    assert results.parent == meta.parent == tmp_path / "h100-sxm"
    ((entries, back),) = autotune.stored("H100 SXM", tmp_path).values()
    assert back == record and autotune.config_of(entries[0]) == CONFIG
    assert autotune.stored("B200", tmp_path) == {}
    assert autotune.dump_options("x")["xla_gpu_use_new_autotune_cache_format"] is False


def test_xla_takes_the_dump_options_per_compile(tmp_path: Path) -> None:
    import jax
    import jax.numpy as jnp

    from labkit.xla.aot import abstract, compile_for_gpu, h100_mesh

    mesh = h100_mesh((1,), ("x",))
    x = abstract(jax.ShapeDtypeStruct((256, 256), jnp.bfloat16), mesh)
    options = autotune.dump_options(tmp_path / "results.textproto")
    # a wrong name would raise here; deviceless, XLA times nothing and may write no file
    result = compile_for_gpu(jnp.matmul, x, x, compiler_options=options, tiles="untuned")
    assert "__triton_nested_gemm_fusion" in result.hlo
