"""Exercise checkers of 06_collective_flags: each accepts a right answer and rejects a wrong one."""

from __future__ import annotations

import pytest
from test_collectives import ASYNC, SYNC

from labkit import exercises

PIPELINED_AG = """\
HloModule m, is_scheduled=true, num_partitions=8

ENTRY %main (a: f32[8]) -> f32[64] {
  %a = f32[8]{0} parameter(0)
  %ags = ((f32[8]{0}), f32[64]{0}) all-gather-start(%a), replica_groups={}, dimensions={0}, backend_config={"collective_backend_config":{"is_pipelined":true}}
  ROOT %agd = f32[64]{0} all-gather-done(%ags)
}
"""  # noqa: E501
PLAIN_AG = PIPELINED_AG.replace('"is_pipelined":true', '"is_pipelined":false')


def test_async_replacement() -> None:
    for right in (
        "xla_gpu_disable_async_collectives",
        "--xla_gpu_disable_async_collectives=ALLREDUCE",
    ):
        assert exercises.check_async_replacement(right).passed
    wrong = exercises.check_async_replacement("xla_gpu_enable_async_collectives")
    assert not wrong.passed and wrong.attempted
    assert not exercises.check_async_replacement(...).attempted


def test_two_all_reduce_groups_with_a_fake_count() -> None:
    def count(threshold: int) -> int:  # the tiny step's counts, as compiled with jaxlib 0.12
        return 1 if threshold > 543235 else 2 if threshold >= 272000 else 3

    assert exercises.check_two_all_reduce_groups(300_000, count=count).passed
    wrong = exercises.check_two_all_reduce_groups(1 << 25, count=count)
    assert not wrong.passed and "gives 1 all-reduce" in wrong.message
    assert not exercises.check_two_all_reduce_groups(-1, count=count).passed
    assert not exercises.check_two_all_reduce_groups("big", count=count).passed
    assert not exercises.check_two_all_reduce_groups(None, count=count).attempted


@pytest.mark.parametrize(("answer", "passed"), [(300_000, True), (0, False)])
def test_two_all_reduce_groups_compiles_for_real(answer: int, passed: bool) -> None:
    assert exercises.check_two_all_reduce_groups(answer).passed is passed


def test_sync_count() -> None:
    assert exercises.check_sync_count(1, ASYNC).passed
    assert exercises.check_sync_count(2, SYNC).passed
    wrong = exercises.check_sync_count(2, ASYNC)
    assert not wrong.passed and wrong.attempted
    assert not exercises.check_sync_count("one", ASYNC).passed


def test_pipelining_options() -> None:
    on = {"xla_gpu_pipeline_all_gather": "COLLECTIVE_PIPELINING_MODE_ON"}

    def fake(options: dict) -> str:
        if "xla_gpu_enable_pipelined_all_gather" in options:
            raise RuntimeError("INVALID_ARGUMENT: No such compile option: 'xla_gpu_enable_...'")
        return PIPELINED_AG if options == on else PLAIN_AG

    assert exercises.check_pipelining_options(on, compile_hlo=fake).passed
    old = exercises.check_pipelining_options(
        {"xla_gpu_enable_pipelined_all_gather": True}, compile_hlo=fake
    )
    assert not old.passed and "XLA_FLAGS" in old.message
    assert not exercises.check_pipelining_options({}, compile_hlo=fake).passed
    assert not exercises.check_pipelining_options("ON", compile_hlo=fake).passed
    assert not exercises.check_pipelining_options(..., compile_hlo=fake).attempted
