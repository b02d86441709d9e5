"""Tests for labkit.collectives: handwritten HLO with exact answers, then real H100 compiles."""

from __future__ import annotations

import dataclasses

import jax
import pytest

from labkit import collectives, hlo
from labkit.flags import FlagError

THRESH = "xla_gpu_all_reduce_combine_threshold_bytes"

# Two all-reduces: an async pair with a fusion between (pipelined), and a synchronous one.
ASYNC = """\
HloModule m, is_scheduled=true, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%fused (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %n = f32[8]{0} negate(%p)
}

ENTRY %main (a: f32[64], b: f32[8]) -> (f32[64], f32[8]) {
  %a = f32[64]{0} parameter(0)
  %b = f32[8]{0} parameter(1)
  %ars = ((f32[64]{0}), f32[64]{0}) all-reduce-start(%a), replica_groups={}, to_apply=%add, backend_config={"collective_backend_config":{"is_sync":false,"is_pipelined":true}}
  %f = f32[8]{0} fusion(%b), kind=kLoop, calls=%fused
  %ard = f32[64]{0} all-reduce-done(%ars)
  %ar = f32[8]{0} all-reduce(%f), replica_groups={}, to_apply=%add, backend_config={"collective_backend_config":{"is_sync":true}}
  ROOT %t = (f32[64]{0}, f32[8]{0}) tuple(%ard, %ar)
}
"""  # noqa: E501
# The same program with both all-reduces synchronous and nothing pipelined.
SYNC = (
    ASYNC.replace(
        "%ars = ((f32[64]{0}), f32[64]{0}) all-reduce-start(%a)", "%ard = f32[64]{0} all-reduce(%a)"
    )
    .replace('"is_sync":false,"is_pipelined":true', '"is_sync":true')
    .replace("  %ard = f32[64]{0} all-reduce-done(%ars)\n", "")
)


@dataclasses.dataclass
class Fake:
    hlo: str


def test_metrics_of_handwritten_hlo() -> None:
    m = collectives.metrics(ASYNC)
    assert m["all-reduce count"] == 2 and m["all-reduce bytes"] == 64 * 4 + 8 * 4
    assert m["async collectives"] == 1 and m["sync collectives"] == 1
    assert m["overlapped pairs"] == 1 and m["compute ops between start/done"] == 1
    assert m["pipelined"] == 1 and collectives.pipelined(ASYNC) == ["ars"]
    assert m["send/recv ops"] == 0 and m["collectives in loops"] == 0


def test_schedule_table_marks_modes_in_program_order() -> None:
    rows = collectives.schedule_table(ASYNC)
    assert [r["collective"] for r in rows] == ["ars", "ar"]
    assert rows[0] | {"computation": ""} == {
        "collective": "ars", "kind": "all-reduce", "bytes": 256, "computation": "",
        "in_loop": False, "mode": "async", "ops_between": 1, "compute_between": 1,
        "pipelined": True,
    }  # fmt: skip
    assert rows[1]["mode"] == "sync" and rows[1]["ops_between"] == 0 and not rows[1]["pipelined"]


def test_diff_changed_and_identical() -> None:
    d = collectives.diff(ASYNC, SYNC)
    assert d["all-reduce count"] == (2, 2)  # same collectives
    assert collectives.changed(d) == {
        "async collectives": (1, 0),
        "sync collectives": (1, 2),
        "overlapped pairs": (1, 0),
        "compute ops between start/done": (1, 0),
        "pipelined": (1, 0),
        "instructions": (12, 11),  # all computations
    }
    rows = collectives.diff_rows(d)
    assert rows[0] == {"metric": "async collectives", "before": 1, "after": 0}
    assert len(collectives.diff_rows(d, only_changed=False)) == len(d)
    assert collectives.identical(ASYNC, ASYNC.replace("%f = ", "%f = ", 1))
    assert collectives.identical(ASYNC, ASYNC + '\nFileNames\n1 "/home/x.py"\n')
    assert not collectives.identical(ASYNC, SYNC)


def test_sweep_with_a_fake_compiler_counts_and_sizes() -> None:
    seen: list[dict] = []

    def fake(preset: str, strategy: str, options: dict, **kwargs: object) -> Fake:
        seen.append(options)
        return Fake(SYNC if options.get(THRESH) == 0 else ASYNC)

    rows = collectives.sweep_threshold([0, 1024], compile_fn=fake, base_options={"x": 1})
    assert seen == [{"x": 1, THRESH: 0}, {"x": 1, THRESH: 1024}]
    assert [(r.threshold, r.kind, r.count, r.max_bytes) for r in rows] == [
        (0, "all-reduce", 2, 256),
        (1024, "all-reduce", 2, 256),
    ]
    assert rows[0].sizes == (32, 256) and rows[0].mean_bytes == 144.0 and not rows[0].is_default
    assert collectives.counts(rows, "all-reduce") == [2, 2]
    with pytest.raises(ValueError, match="strategy must be one of"):
        collectives.sweep_threshold([0], strategy="tp", compile_fn=fake)


def test_sweep_none_means_xla_default() -> None:
    seen: list[dict] = []

    def fake(preset: str, strategy: str, options: dict, **kwargs: object) -> Fake:
        seen.append(options)
        return Fake(ASYNC)

    (ag, rs) = collectives.sweep_threshold([None], strategy="fsdp", compile_fn=fake)
    assert seen == [{}]  # nothing set
    assert ag.is_default and ag.threshold == collectives.default_threshold("fsdp") > 1 << 20
    assert (ag.kind, ag.count, rs.kind, rs.count) == ("all-gather", 0, "reduce-scatter", 0)


def test_gradient_sizes_of_tiny() -> None:
    sizes = collectives.gradient_sizes("tiny")
    assert len(sizes) == 25 and sum(sizes.values()) == 543232
    assert sizes["tok_embed/embedding"] == 256 * 64 * 4
    assert sizes["blocks/0/ln1/scale"] == 64 * 4


def test_timing_rows_against_baseline() -> None:
    from labkit.bench import Timing

    rows = collectives.timing_rows(
        {"default": Timing((0.002, 0.002), 0.1), "x": Timing((0.003,), 0.1)}
    )
    assert rows[0] == {"flags": "default", "median ms": 2.0, "spread": "0%", "vs baseline": "1.00x"}
    assert rows[1]["vs baseline"] == "1.50x"


def test_compile_step_threshold_zero_and_cache() -> None:
    first = collectives.compile_step("tiny", "dp", {THRESH: 0})
    assert collectives.compile_step("tiny", "dp", {THRESH: 0}) is first  # cached
    kinds = [c.kind for c in hlo.collectives(first.hlo)]
    assert kinds.count("all-reduce") == 25 + 1  # one per gradient, plus the loss
    assert collectives.metrics(first.hlo)["async collectives"] > 0


def test_xla_flags_in_a_subprocess_match_per_compile_options() -> None:
    run = collectives.compile_with_xla_flags(f"--{THRESH}=0")
    assert run.xla_flags == f"--{THRESH}=0" and run.summary["collectives"]["all-reduce"] == 26
    assert collectives.identical(run.hlo, collectives.compile_step("tiny", "dp", {THRESH: 0}).hlo)
    with pytest.raises(FlagError, match="would abort JAX"):
        collectives.compile_with_xla_flags("--xla_gpu_enable_async_collectives=true")


def test_permute_decomposer_needs_pipelined_p2p() -> None:
    base = collectives.compile_shift_loop()
    alone = collectives.compile_shift_loop({"xla_gpu_collective_permute_decomposer_threshold": 0})
    p2p = collectives.compile_shift_loop(
        {"xla_gpu_enable_pipelined_p2p": True, "xla_gpu_collective_permute_decomposer_threshold": 0}
    )
    assert collectives.metrics(base.hlo)["collective-permute count"] == 1
    assert collectives.identical(base.hlo, alone.hlo)
    assert collectives.metrics(p2p.hlo)["send/recv ops"] == 4


def test_local_step_runs_on_cpu_and_ignores_gpu_flags() -> None:
    cpu = jax.devices("cpu")
    compiled, state, batch = collectives.local_step("tiny", "dp", 16, devices=cpu)
    flagged, _, _ = collectives.local_step("tiny", "dp", 16, {THRESH: 0}, devices=cpu)
    assert collectives.identical(compiled.as_text(), flagged.as_text())
    timing = collectives.time_steps(compiled, state, batch, repeats=2, warmup=1)
    assert len(timing.times) == 2 and timing.median > 0
    assert all(not x.is_deleted() for x in jax.tree.leaves(state))  # donation hit a copy
