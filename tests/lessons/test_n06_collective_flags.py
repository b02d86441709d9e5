"""labkit.lessons.n06_collective_flags: sweeps, the shift loop, the flag explorer, checkers."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from hlo_programs import ASYNC, HEADER, SYNC

from labkit.core.hardware import LATENCIES, hardware
from labkit.lessons import n06_collective_flags as n06
from labkit.xla import hlo, overlap, predict
from labkit.xla.compare import identical, metrics, schedule_table

THRESH = "xla_gpu_all_reduce_combine_threshold_bytes"
LINK = (hardware("H100 SXM").nvlink_gbps or 0) / 2 * 1e3  # bytes per microsecond, one direction
PIPELINED_AG = """\
HloModule m, is_scheduled=true, num_partitions=8

ENTRY %main (a: f32[8]) -> f32[64] {
  %a = f32[8]{0} parameter(0)
  %ags = ((f32[8]{0}), f32[64]{0}) all-gather-start(%a), replica_groups={}, dimensions={0}, backend_config={"collective_backend_config":{"is_pipelined":true}}
  ROOT %agd = f32[64]{0} all-gather-done(%ags)
}
"""  # noqa: E501
PLAIN_AG = PIPELINED_AG.replace('"is_pipelined":true', '"is_pipelined":false')
# A merged all-reduce: one fusion packs two buffers, one slice per buffer unpacks them.
PACKED = (
    HEADER
    + """

%cat (p0: f32[4], p1: f32[4]) -> f32[8] {
  %p0 = f32[4]{0} parameter(0)
  %p1 = f32[4]{0} parameter(1)
  ROOT %c = f32[8]{0} concatenate(%p0, %p1), dimensions={0}
}

%lo (p: f32[8]) -> f32[4] {
  %p = f32[8]{0} parameter(0)
  ROOT %s = f32[4]{0} slice(%p), slice={[0:4]}
}

%hi (p: f32[8]) -> f32[4] {
  %p = f32[8]{0} parameter(0)
  ROOT %s = f32[4]{0} slice(%p), slice={[4:8]}
}

ENTRY %main (a: f32[4], b: f32[4]) -> (f32[4], f32[4]) {
  %a = f32[4]{0} parameter(0)
  %b = f32[4]{0} parameter(1)
  %packed = f32[8]{0} fusion(%a, %b), kind=kLoop, calls=%cat
  %ars = ((f32[8]{0}), f32[8]{0}) all-reduce-start(%packed), replica_groups={}, to_apply=%add
  %ard = f32[8]{0} all-reduce-done(%ars)
  %u0 = f32[4]{0} fusion(%ard), kind=kLoop, calls=%lo
  %u1 = f32[4]{0} fusion(%ard), kind=kLoop, calls=%hi
  ROOT %t = (f32[4]{0}, f32[4]{0}) tuple(%u0, %u1)
}
"""
)


@dataclasses.dataclass
class Fake:
    hlo: str


class FakeCompiler:
    """Returns the synchronous program when async all-reduces are switched off; counts calls."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, cfg: object, strategy: str, options: dict, **kwargs: object) -> Fake:
        self.calls.append(dict(options))
        return Fake(
            SYNC if "ALLREDUCE" in str(options.get("xla_gpu_disable_async_collectives")) else ASYNC
        )


def test_sweep_with_a_fake_compiler_counts_and_sizes() -> None:
    seen: list[dict] = []

    def fake(cfg: object, strategy: str, options: dict, **kwargs: object) -> Fake:
        seen.append(options)
        return Fake(SYNC if options.get(THRESH) == 0 else ASYNC)

    rows = n06.sweep_threshold([0, 1024], compile_fn=fake, base_options={"x": 1})
    assert seen == [{"x": 1, THRESH: 0}, {"x": 1, THRESH: 1024}]
    assert [(r.threshold, r.kind, r.count, r.max_bytes) for r in rows] == [
        (0, "all-reduce", 2, 256),
        (1024, "all-reduce", 2, 256),
    ]
    assert rows[0].sizes == (32, 256) and rows[0].mean_bytes == 144.0 and not rows[0].is_default
    assert n06.counts(rows, "all-reduce") == [2, 2]
    with pytest.raises(ValueError, match="strategy must be one of"):
        n06.sweep_threshold([0], strategy="tp", compile_fn=fake)
    with pytest.raises(TypeError, match='-y "DP_THRESHOLDS: '):  # what papermill -p passes
        n06.sweep_threshold("[0, 1024]", compile_fn=fake)


def test_sweep_none_means_xla_default() -> None:
    seen: list[dict] = []

    def fake(cfg: object, strategy: str, options: dict, **kwargs: object) -> Fake:
        seen.append(options)
        return Fake(ASYNC)

    (ag, rs) = n06.sweep_threshold([None], strategy="fsdp", compile_fn=fake)
    assert seen == [{}]  # nothing set
    assert ag.is_default and ag.threshold == n06.default_threshold("fsdp") > 1 << 20
    assert (ag.kind, ag.count, rs.kind, rs.count) == ("all-gather", 0, "reduce-scatter", 0)


def test_sweep_picture_draws_counts_and_sizes_per_kind() -> None:
    dp = [
        n06.SweepRow(0, "all-reduce", 26, 2600, 100.0, 400, ()),
        n06.SweepRow(1 << 20, "all-reduce", 1, 2600, 2600.0, 2600, (), True),
    ]
    fsdp = [
        n06.SweepRow(0, "all-gather", 25, 2500, 100.0, 400, ()),
        n06.SweepRow(0, "reduce-scatter", 24, 2400, 100.0, 400, ()),
    ]
    shown = n06.sweep_picture({"DP": dp, "FSDP": fsdp}, "Sweep")
    assert shown.figure is not None and shown.figure.get_suptitle() == "Sweep"
    counts, sizes = shown.figure.axes
    assert (counts.get_ylabel(), sizes.get_ylabel()) == (
        "collectives per step",
        "mean bytes per collective",
    )
    assert counts.get_xscale() == "symlog"
    assert [ln.get_label() for ln in counts.lines] == [
        "all-reduce (DP)",
        "all-gather (FSDP)",
        "reduce-scatter (FSDP)",
    ]
    assert "all-reduce (DP): 26 at 0 B, 1 at 1.05 MB" in shown.caption
    assert "mean bytes per collective: all-reduce (DP): 100 B at 0 B, 2600 B at" in shown.caption


def test_permute_decomposer_needs_pipelined_p2p() -> None:
    base = n06.compile_shift_loop()
    alone = n06.compile_shift_loop({"xla_gpu_collective_permute_decomposer_threshold": 0})
    p2p = n06.compile_shift_loop(
        {"xla_gpu_enable_pipelined_p2p": True, "xla_gpu_collective_permute_decomposer_threshold": 0}
    )
    assert metrics(base.hlo)["collective-permute count"] == 1
    assert identical(base.hlo, alone.hlo)
    assert metrics(p2p.hlo)["send/recv ops"] == 4
    # the default permute is already async with the loop's MLP in between, and its two GEMMs
    # alone outlast alpha + bytes / link: hidden; decomposed, the recv has the same kernels
    # between; nothing crosses an iteration
    (permute,) = overlap.estimate(base.hlo)
    assert (permute.mode, permute.matmuls, permute.verdict) == ("async", 2, "hidden")
    gemm_s = 2 * 2 * 256 * 256 * 16384 / (hardware("H100 SXM").tf32_tflops * 1e12)
    alpha_s, wire_s = LATENCIES.collective_us * 1e-6, 256 * 1024 / (LINK * 1e6)  # a 256 KiB block
    assert permute.transfer_s == pytest.approx(alpha_s + wire_s)
    assert permute.transfer_s < gemm_s < permute.compute_s
    recv = [e for e in overlap.estimate(p2p.hlo) if e.kind == "recv"]
    assert [(e.kernels, e.matmuls, e.verdict) for e in recv] == [(permute.kernels, 2, "hidden")]
    assert metrics(base.hlo)["transfers across loop iterations"] == 0
    assert metrics(p2p.hlo)["transfers across loop iterations"] == 0


@functools.cache
def scanned_mlp() -> str:
    """The scanned FSDP MLP's H100 program, compiled once for this module."""
    return str(n06.compile_scanned_mlp().hlo)


def test_scanned_mlp_gathers_per_layer_and_leaves_a_scatter_synchronous() -> None:
    text = scanned_mlp()
    gathers = [r for r in schedule_table(text) if r["kind"] == "all-gather"]
    assert len(gathers) == 2 and all(r["in_loop"] for r in gathers)  # forward and backward
    assert metrics(text)["pipelined"] == 0
    (stuck,) = n06.synchronous(text)  # the backward loop's reduce-scatter: too little beside
    assert (stuck["kind"], stuck["in_loop"]) == ("reduce-scatter", True)
    assert stuck["bytes"] == 1024 * 1024 * 4  # one layer's f32 gradient, scattered
    assert 0 < stuck["independent_us"] < stuck["transfer_us"]


def test_pipelining_options_compiles_the_mlp() -> None:
    on = {"xla_gpu_pipeline_all_gather": "COLLECTIVE_PIPELINING_MODE_ON"}
    assert n06.check_pipelining_options(on).passed  # wrong answers: the fake compiles below


def test_traced_mlp_the_all_reduce_option_pipelines_the_scatters() -> None:
    on = {"xla_gpu_pipeline_all_reduce": "COLLECTIVE_PIPELINING_MODE_ON"}
    result, passes = n06.traced_scanned_mlp(on)
    assert not identical(result.hlo, scanned_mlp())
    piped = {r["kind"] for r in schedule_table(result.hlo) if r["pipelined"]}
    assert piped == {"reduce-scatter"}  # made from a pipelined all-reduce
    names = [p.name for p in passes]
    assert "spmd-partitioning" in names and "reduce-scatter-creator" in names
    piper = next(p for p in passes if p.name.startswith("collective-pipeliner"))
    assert "reduce-scatter" not in piper.collectives and piper.collectives["all-reduce"] > 0
    assert names.index(piper.name) < names.index("reduce-scatter-creator")


def test_cpu_ignores_gpu_flags() -> None:
    flags = {
        THRESH: 0,
        "xla_gpu_enable_latency_hiding_scheduler": False,
        "xla_gpu_disable_async_collectives": "ALLREDUCE",
    }
    default = n06.compile_cpu_sums()
    assert identical(default, n06.compile_cpu_sums(flags))
    assert metrics(default)["all-reduce count"] == 1  # the CPU merges the two psums


def test_flag_tokens_merge_disable_lists_and_thresholds() -> None:
    picked = ["all-reduce synchronous", "all-gather synchronous", "latency-hiding scheduler off"]
    assert n06.flag_tokens(picked, None) == [
        "--xla_gpu_enable_latency_hiding_scheduler=false",
        "--xla_gpu_disable_async_collectives=ALLREDUCE,ALLGATHER",
    ]
    assert n06.flag_tokens([], 1024, "fsdp") == [
        "--xla_gpu_all_gather_combine_threshold_bytes=1024",
        "--xla_gpu_reduce_scatter_combine_threshold_bytes=1024",
    ]
    with pytest.raises(ValueError, match="unknown choices"):
        n06.flag_tokens(["turbo"], None)


def test_flag_diff_compiles_baseline_and_flagged() -> None:
    fake = FakeCompiler()
    result = n06.flag_diff(["all-reduce synchronous"], 0, compile_fn=fake)
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
    result = n06.flag_diff(["latency-hiding scheduler off"], None, compile_fn=FakeCompiler())
    assert result.identical and result.table().startswith("No change")
    assert result.options == {"xla_gpu_enable_latency_hiding_scheduler": False}


def test_explorer_compiles_only_when_clicked() -> None:
    fake = FakeCompiler()
    box = n06.flag_explorer(compile_fn=fake)
    assert fake.calls == []  # creating the widget compiles nothing
    checkboxes = [c for c in box.children if c.__class__.__name__ == "Checkbox"]
    slider = next(c for c in box.children if c.__class__.__name__ == "SelectionSlider")
    button = next(c for c in box.children if c.__class__.__name__ == "Button")
    assert [c.description for c in checkboxes] == list(n06.CHOICES)
    assert slider.value == n06.DEFAULT
    checkboxes[1].value = True  # all-reduce synchronous
    slider.value = 0
    button.click()
    assert len(fake.calls) == 2
    assert fake.calls[1]["xla_gpu_all_reduce_combine_threshold_bytes"] == 0


def test_sync_gathers_with_a_fake_compile() -> None:
    compiled: list[dict[str, object]] = []

    def compile_hlo(options: dict[str, object]) -> str:  # SYNC: an all-reduce, synchronous
        compiled.append(options)
        return SYNC if options else ASYNC

    wrong = n06.check_sync_gathers({"xla_gpu_disable_async_collectives": "ALLREDUCE"}, compile_hlo)
    assert not wrong.passed and wrong.attempted and "compiles to" in wrong.message
    assert compiled == [{"xla_gpu_disable_async_collectives": "ALLREDUCE"}]
    assert "expected a dict" in n06.check_sync_gathers("ALLGATHER", compile_hlo).message
    assert not n06.check_sync_gathers(...).attempted


@pytest.mark.aot
def test_sync_gathers_compiles_the_fsdp_step() -> None:
    right = {"xla_gpu_disable_async_collectives": "ALLGATHER,REDUCESCATTER"}
    assert n06.check_sync_gathers(right).passed
    assert not n06.check_sync_gathers({}).passed  # the default: everything async


def test_two_all_reduce_groups_with_a_fake_count() -> None:
    def count(threshold: int) -> int:  # the tiny step's counts, as compiled with jaxlib 0.12
        return 1 if threshold > 543235 else 2 if threshold >= 272000 else 3

    assert n06.check_two_all_reduce_groups(300_000, count=count).passed
    wrong = n06.check_two_all_reduce_groups(1 << 25, count=count)
    assert not wrong.passed and "gives 1 all-reduce" in wrong.message
    assert not n06.check_two_all_reduce_groups(-1, count=count).passed
    assert not n06.check_two_all_reduce_groups("big", count=count).passed
    assert not n06.check_two_all_reduce_groups(None, count=count).attempted


def test_two_all_reduce_groups_compiles_for_real() -> None:
    # one compile (the cuBLAS variant); the fake count above covers the wrong answers
    assert n06.check_two_all_reduce_groups(300_000).passed


def test_counting_compiles_the_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict] = []

    def fake(cfg: object, strategy: str, options: dict, **kwargs: object) -> Fake:
        seen.append({"options": options, **kwargs})
        return Fake(ASYNC)

    monkeypatch.setattr(n06, "compile_train_step", fake)
    assert n06.count_all_reduces(1024) == 2
    assert seen == [{"options": {THRESH: 1024}, "batch_size": 32, "variant": "cublas"}]


def test_collective_sizes_ignore_kernels_and_order() -> None:
    assert n06.collective_sizes(ASYNC) == [("all-reduce", 32), ("all-reduce", 256)]
    assert n06.collective_sizes(SYNC) == n06.collective_sizes(ASYNC)
    assert n06.collective_sizes(PACKED) == [("all-reduce", 32)]


def test_overlap_rows_by_hand() -> None:
    # ASYNC: a 256-byte async all-reduce with one 1 us kernel beside it, and a synchronous
    # 32-byte one. Ring all-reduce over 8: 2 * 7/8 of the buffer on a 450 GB/s link.
    alpha, floor = LATENCIES.collective_us, LATENCIES.kernel_floor_us
    wire = (2 * 7 / 8 * 256 + 2 * 7 / 8 * 32) / LINK
    (row,) = n06.overlap_rows({"async": overlap.estimate(ASYNC)})
    assert row == {
        "program": "async",
        "hidden": 0,
        "partly hidden": 1,
        "exposed": 1,
        "latency_us": 2 * alpha,
        "wire_us": round(wire, 2),
        "transfer_us": round(2 * alpha + wire, 2),
        "hidden_us": floor,
        "exposed_us": round(2 * alpha + wire - floor, 2),
    }


def test_prediction_rows_side_by_side() -> None:
    rows = n06.prediction_rows({"a": ASYNC, "b": SYNC})
    assert [r["term"] for r in rows] == [r["term"] for r in predict.predict(ASYNC).rows()]
    by_term = {r["term"]: r for r in rows}
    assert (by_term["kernels"]["a"], by_term["kernels"]["b"]) == (1, 1)
    assert (by_term["collectives"]["a"], by_term["collectives"]["b"]) == (2, 2)
    assert by_term["exposed communication"]["b"] > by_term["exposed communication"]["a"]


def test_synchronous_lists_what_could_have_run_beside() -> None:
    assert n06.synchronous(ASYNC) == [
        {
            "collective": "ar",
            "kind": "all-reduce",
            "computation": "main",
            "in_loop": False,
            "bytes": 32,
            "transfer_us": round(LATENCIES.collective_us + 56 / LINK, 3),
            "independent kernels": 0,  # it reduces the fusion's result
            "independent_us": 0.0,
        }
    ]
    first, second = n06.synchronous(SYNC)
    assert (first["collective"], first["independent kernels"], first["independent_us"]) == (
        "ard",
        1,  # the fusion neither feeds it nor reads it
        LATENCIES.kernel_floor_us,
    )
    assert (second["collective"], second["independent kernels"]) == ("ar", 0)


def test_pack_and_unpack() -> None:
    assert n06.pack_and_unpack(PACKED, "ars") == (["packed"], ["u0", "u1"])
    with pytest.raises(ValueError, match="no async start named 'ard'"):
        n06.pack_and_unpack(PACKED, "ard")


def test_scheduler_off_with_a_fake_compile() -> None:
    seen: list[dict[str, object]] = []

    def compile_hlo(options: dict[str, object]) -> str:
        seen.append(options)
        return SYNC

    reduces = [c for c in hlo.collectives(SYNC) if c.kind == "all-reduce"]
    right = (len(reduces), sum(not c.is_async for c in reduces))
    assert n06.check_scheduler_off(right, compile_hlo=compile_hlo).passed
    assert seen[0] == {
        "xla_gpu_all_reduce_combine_threshold_bytes": n06.SCHEDULER_OFF_THRESHOLD,
        "xla_gpu_enable_latency_hiding_scheduler": False,
    }
    wrong = n06.check_scheduler_off((right[0], right[1] + 1), compile_hlo=compile_hlo)
    assert not wrong.passed and wrong.attempted
    assert "expected (count" in n06.check_scheduler_off(3, compile_hlo=compile_hlo).message


def test_pipelining_options() -> None:
    on = {"xla_gpu_pipeline_all_gather": "COLLECTIVE_PIPELINING_MODE_ON"}

    def fake(options: dict) -> str:
        if "xla_gpu_enable_pipelined_all_gather" in options:
            raise RuntimeError("INVALID_ARGUMENT: No such compile option: 'xla_gpu_enable_...'")
        return PIPELINED_AG if options == on else PLAIN_AG

    assert n06.check_pipelining_options(on, compile_hlo=fake).passed
    old = n06.check_pipelining_options(
        {"xla_gpu_enable_pipelined_all_gather": True}, compile_hlo=fake
    )
    assert not old.passed and "XLA_FLAGS" in old.message
    assert not n06.check_pipelining_options({}, compile_hlo=fake).passed
    assert not n06.check_pipelining_options("ON", compile_hlo=fake).passed
    assert not n06.check_pipelining_options(..., compile_hlo=fake).attempted
