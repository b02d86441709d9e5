"""Tests for labkit.widgets without a browser: the logic function, and the widget's wiring."""

from __future__ import annotations

import dataclasses

import pytest
from test_collectives import ASYNC, SYNC

from labkit import widgets


@dataclasses.dataclass
class Fake:
    hlo: str


class FakeCompiler:
    """Returns the synchronous program when async all-reduces are switched off; counts calls."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, preset: str, strategy: str, options: dict, **kwargs: object) -> Fake:
        self.calls.append(dict(options))
        return Fake(
            SYNC if "ALLREDUCE" in str(options.get("xla_gpu_disable_async_collectives")) else ASYNC
        )


def test_flag_tokens_merge_disable_lists_and_thresholds() -> None:
    picked = ["all-reduce synchronous", "all-gather synchronous", "latency-hiding scheduler off"]
    assert widgets.flag_tokens(picked, None) == [
        "--xla_gpu_enable_latency_hiding_scheduler=false",
        "--xla_gpu_disable_async_collectives=ALLREDUCE,ALLGATHER",
    ]
    assert widgets.flag_tokens([], 1024, "fsdp") == [
        "--xla_gpu_all_gather_combine_threshold_bytes=1024",
        "--xla_gpu_reduce_scatter_combine_threshold_bytes=1024",
    ]
    with pytest.raises(ValueError, match="unknown choices"):
        widgets.flag_tokens(["turbo"], None)


def test_flag_diff_compiles_baseline_and_flagged() -> None:
    fake = FakeCompiler()
    result = widgets.flag_diff(["all-reduce synchronous"], 0, compile_fn=fake)
    assert fake.calls == [
        {},
        {
            "xla_gpu_disable_async_collectives": "ALLREDUCE",
            "xla_gpu_all_reduce_combine_threshold_bytes": 0,
        },
    ]
    assert result.diff["async collectives"] == (1, 0) and not result.identical
    assert "| async collectives | 1 | 0 |" in result.table()


def test_flag_diff_reports_no_change() -> None:
    result = widgets.flag_diff(["latency-hiding scheduler off"], None, compile_fn=FakeCompiler())
    assert result.identical and result.table().startswith("No change")
    assert result.options == {"xla_gpu_enable_latency_hiding_scheduler": False}


def test_explorer_compiles_only_when_clicked() -> None:
    fake = FakeCompiler()
    box = widgets.flag_explorer(compile_fn=fake)
    assert fake.calls == []  # creating the widget compiles nothing
    checkboxes = [c for c in box.children if c.__class__.__name__ == "Checkbox"]
    slider = next(c for c in box.children if c.__class__.__name__ == "SelectionSlider")
    button = next(c for c in box.children if c.__class__.__name__ == "Button")
    assert [c.description for c in checkboxes] == list(widgets.CHOICES)
    assert slider.value == widgets.DEFAULT
    checkboxes[1].value = True  # all-reduce synchronous
    slider.value = 0
    button.click()
    assert len(fake.calls) == 2
    assert fake.calls[1]["xla_gpu_all_reduce_combine_threshold_bytes"] == 0
