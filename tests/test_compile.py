"""labkit.gpt.compile: the one compile entry, its cache, subprocess flags, local steps."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from labkit.gpt import compile as collectives
from labkit.gpt.config import GPTConfig
from labkit.xla import hlo
from labkit.xla.compare import identical, metrics
from labkit.xla.flags import FlagError

THRESH = "xla_gpu_all_reduce_combine_threshold_bytes"


def test_gradient_sizes_of_tiny() -> None:
    sizes = collectives.gradient_sizes("tiny")
    assert len(sizes) == 25 and sum(sizes.values()) == 543232
    assert sizes["tok_embed/embedding"] == 256 * 64 * 4
    assert sizes["blocks/0/ln1/scale"] == 64 * 4


def test_compile_step_threshold_zero_and_cache() -> None:
    first = collectives.compile_train_step("tiny", "dp", {THRESH: 0}, variant="cublas")
    again = collectives.compile_train_step("tiny", "dp", {THRESH: 0}, variant="cublas")
    assert again is first  # cached
    kinds = [c.kind for c in hlo.collectives(first.hlo)]
    assert kinds.count("all-reduce") == 25 + 1  # one per gradient, plus the loss
    assert metrics(first.hlo)["async collectives"] > 0


def test_xla_flags_in_a_subprocess_match_per_compile_options() -> None:
    run = collectives.compile_with_xla_flags(f"--{THRESH}=0", variant="cublas")
    assert run.xla_flags == f"--{THRESH}=0" and run.summary["collectives"]["all-reduce"] == 26
    per_compile = collectives.compile_train_step("tiny", "dp", {THRESH: 0}, variant="cublas")
    assert identical(run.hlo, per_compile.hlo)
    with pytest.raises(FlagError, match="would abort JAX"):
        collectives.compile_with_xla_flags("--xla_gpu_enable_async_collectives=true")


def test_local_step_runs_on_cpu_and_ignores_gpu_flags() -> None:
    cpu = jax.devices("cpu")
    compiled, state, batch = collectives.local_train_step("tiny", "dp", 16, devices=cpu)
    flagged, _, _ = collectives.local_train_step("tiny", "dp", 16, {THRESH: 0}, devices=cpu)
    assert identical(compiled.as_text(), flagged.as_text())
    timing = collectives.time_steps(compiled, state, batch, repeats=2, warmup=1)
    assert len(timing.times) == 2 and timing.median > 0
    assert all(not x.is_deleted() for x in jax.tree.leaves(state))  # donation hit a copy


def test_cache_is_keyed_on_the_whole_config() -> None:
    f32 = collectives.compile_train_step("tiny", "dp", variant="cublas")
    same = collectives.compile_train_step(GPTConfig.preset("tiny"), "dp", variant="cublas")
    assert same is f32  # the same config
    bf16_cfg = GPTConfig.preset("tiny", dtype=jnp.bfloat16)
    bf16 = collectives.compile_train_step(bf16_cfg, "dp", variant="cublas")
    assert bf16 is not f32 and "bf16[" in bf16.hlo


def test_unknown_preset_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown GPT preset 'huge'; choose one of \['base'"):
        collectives.compile_train_step("huge")


def test_config_json_round_trip() -> None:
    from labkit.gpt.config import config_from_json, config_to_json

    cfg = GPTConfig.preset("tiny", dtype=jnp.bfloat16, scan_layers=True)
    assert config_from_json(config_to_json(cfg)) == cfg
    with pytest.raises(ValueError, match="custom dot_general"):
        config_to_json(GPTConfig.preset("tiny", dot_general=jax.lax.dot_general))


def test_cpu_step_options_drop_only_ynnpack_reductions() -> None:
    from labkit.gpt.train import CPU_STEP_OPTIONS
    from labkit.xla.flags import default_of

    name = "xla_cpu_experimental_ynn_fusion_type"
    default = set(default_of(name).split(","))
    ours = set(CPU_STEP_OPTIONS[name].split(","))
    assert "LIBRARY_FUSION_TYPE_REDUCE" in default, f"{name} default is now {default}"
    assert ours == default - {"LIBRARY_FUSION_TYPE_REDUCE"}


def _ynn_reductions(hlo: str) -> int:
    """YNNPACK fusions whose fused computation holds a reduce."""
    import re

    bodies: dict[str, str] = {}
    called = re.findall(r'calls=%([\w.\-]+), [^\n]*"kind":"__ynn_fusion"', hlo)
    for name in called:
        start = hlo.index(f"\n%{name} (")
        bodies[name] = hlo[start : hlo.index("\n}", start)]
    return sum(" reduce(" in bodies[n] for n in called)


def test_cpu_step_keeps_reductions_out_of_ynnpack_and_h100_step_has_no_cpu_option() -> None:
    import jax

    from labkit.core.mesh import make_mesh
    from labkit.gpt import train
    from labkit.gpt.config import GPTConfig
    from labkit.xla.aot import h100_mesh
    from labkit.xla.flags import default_of

    cfg = GPTConfig.preset("tiny")
    cpu = make_mesh((1,), ("data",), devices=jax.devices()[:1])
    step, state, batch = train.train_setup(cfg, cpu, "dp", 8)
    lowered = step.lower(state, batch)
    ours = lowered.compile().as_text()
    name = "xla_cpu_experimental_ynn_fusion_type"
    default = lowered.compile(compiler_options={name: default_of(name)}).as_text()
    assert "__ynn_fusion" in ours  # dots still go to YNNPACK
    assert _ynn_reductions(ours) == 0 < _ynn_reductions(default)
    assert ours.count("wrapped_broadcast") < default.count("wrapped_broadcast")
    gpu_step, *_ = train.train_setup(cfg, h100_mesh((8,), ("data",)), "dp", 8)
    assert gpu_step._jit_info.compiler_options_kvs == ()  # no CPU option on an H100 step


@pytest.mark.aot
def test_the_compile_options_leave_xla_s_default_program_byte_for_byte() -> None:
    from pathlib import Path

    from labkit.gpt import train
    from labkit.xla.aot import h100_mesh

    # Untuned: a plain compile gets XLA's untuned tiles (the rule's are an option of their own,
    # with a kernel cache file of their own: labkit.xla.aot.kernel_cache_for)
    collectives.compile_train_step("tiny", "fsdp", batch_size=8, tiles="untuned")  # fills it
    ours = collectives.compile_train_step("tiny", "dp", batch_size=8, tiles="untuned")
    assert Path(collectives.kernel_cache_file()).stat().st_size > 0
    mesh = h100_mesh((8,), ("data",))
    step, state, batch = train.train_setup(GPTConfig.preset("tiny"), mesh, "dp", 8)
    plain = step.lower(state, batch).compile().as_text()  # XLA's defaults, no option at all
    assert ours.hlo == plain


@pytest.mark.aot
def test_the_cublas_variant_differs_from_the_default_program_in_its_gemms() -> None:
    default = collectives.compile_train_step("tiny", "dp", batch_size=8)
    variant = collectives.compile_train_step("tiny", "dp", batch_size=8, variant="cublas")
    gemm_fusions = "kCustom:__triton_nested_gemm_fusion"
    assert hlo.kernel_counts(default.hlo)[gemm_fusions] == 43  # XLA's default: Triton GEMMs
    assert gemm_fusions not in hlo.kernel_counts(variant.hlo)
    assert hlo.custom_calls(variant.hlo)["__cublas$lt$matmul"] == 43
    assert hlo.collective_counts(default.hlo) == hlo.collective_counts(variant.hlo)
    with pytest.raises(ValueError, match="choose one of"):
        collectives.compile_train_step("tiny", variant="fast")
