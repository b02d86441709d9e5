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
    first = collectives.compile_train_step("tiny", "dp", {THRESH: 0})
    assert collectives.compile_train_step("tiny", "dp", {THRESH: 0}) is first  # cached
    kinds = [c.kind for c in hlo.collectives(first.hlo)]
    assert kinds.count("all-reduce") == 25 + 1  # one per gradient, plus the loss
    assert metrics(first.hlo)["async collectives"] > 0


def test_xla_flags_in_a_subprocess_match_per_compile_options() -> None:
    run = collectives.compile_with_xla_flags(f"--{THRESH}=0")
    assert run.xla_flags == f"--{THRESH}=0" and run.summary["collectives"]["all-reduce"] == 26
    assert identical(run.hlo, collectives.compile_train_step("tiny", "dp", {THRESH: 0}).hlo)
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
    f32 = collectives.compile_train_step("tiny", "dp")
    assert collectives.compile_train_step(GPTConfig.preset("tiny"), "dp") is f32  # same config
    bf16 = collectives.compile_train_step(GPTConfig.preset("tiny", dtype=jnp.bfloat16), "dp")
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
