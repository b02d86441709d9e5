"""labkit.lessons.n00_welcome: each checker accepts a right answer and rejects a wrong one."""

from __future__ import annotations

import pytest

from labkit.core import figures
from labkit.core.hardware import hardware, ridge_intensity
from labkit.lessons import n00_welcome as exercises

TWO_ALL_REDUCES = """HloModule m, is_scheduled=true

ENTRY %main (p0: f32[8], p1: f32[4]) -> (f32[8], f32[4]) {
  %p0 = f32[8]{0} parameter(0)
  %p1 = f32[4]{0} parameter(1)
  %ars = f32[8]{0} all-reduce-start(%p0), replica_groups={{0,1}}, to_apply=%add
  %ard = f32[8]{0} all-reduce-done(%ars)
  %ar = f32[4]{0} all-reduce(%p1), replica_groups={{0,1}}, to_apply=%add
  ROOT %t = (f32[8]{0}, f32[4]{0}) tuple(%ard, %ar)
}
"""


def test_ridge_matmul_size_checker() -> None:
    right = 3 * ridge_intensity()
    assert exercises.check_ridge_matmul_size(round(right)).passed
    wrong = exercises.check_ridge_matmul_size(round(ridge_intensity()))
    assert not wrong.passed and wrong.attempted and "n/3" in wrong.message
    assert not exercises.check_ridge_matmul_size("many").passed


def test_unanswered_is_not_an_error() -> None:
    feedback = exercises.check_ridge_matmul_size(...)
    assert not feedback.passed and not feedback.attempted
    assert "replace ..." in str(feedback)
    assert not exercises.check_all_reduce_count(None, TWO_ALL_REDUCES).attempted


def test_all_reduce_count_checker_counts_pairs_once() -> None:
    assert exercises.check_all_reduce_count(2, TWO_ALL_REDUCES).passed
    assert not exercises.check_all_reduce_count(3, TWO_ALL_REDUCES).passed  # start + done + 1
    assert not exercises.check_all_reduce_count("two", TWO_ALL_REDUCES).passed


FSDP_LIKE = """HloModule f, is_scheduled=true, num_partitions=2

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %main (w: f32[4,8], x: f32[8,4]) -> f32[8,8] {
  %w = f32[4,8]{1,0} parameter(0)
  %x = f32[8,4]{1,0} parameter(1)
  %ag = f32[8,8]{1,0} all-gather(%w), dimensions={0}, replica_groups={{0,1}}
  %d = f32[8,8]{1,0} dot(%x, %ag), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %ars = ((f32[8,8]{1,0}), f32[8,8]{1,0}) all-reduce-start(%d), replica_groups={{0,1}}, to_apply=%add
  ROOT %ard = f32[8,8]{1,0} all-reduce-done(%ars)
}
"""  # noqa: E501


def test_entry_collectives_in_schedule_order_with_matmuls_around() -> None:
    rows = exercises.entry_collectives(FSDP_LIKE)
    assert rows == [
        {
            "kind": "all-gather",
            "bytes": 256,
            "mode": "sync",
            "matmuls_before": 0,
            "matmuls_after": 1,
        },
        {
            "kind": "all-reduce",
            "bytes": 256,
            "mode": "async",
            "matmuls_before": 1,
            "matmuls_after": 0,
        },
    ]


def test_the_notebooks_ridge_arithmetic_is_the_hardware_tables() -> None:
    h100 = hardware("H100 SXM")  # 00 prints peak / bandwidth computed by hand
    assert h100.bf16_tflops * 1e12 / (h100.hbm_gbps * 1e9) == ridge_intensity("H100 SXM")


def test_kernel_points_place_each_gemm_by_the_cost_model() -> None:
    from pathlib import Path

    from labkit.core.hardware import LATENCIES

    text = (Path(__file__).parent.parent / "data" / "hlo" / "remat_mlp.hlo").read_text()
    points = exercises.kernel_points(text)
    assert len(points) == 20 and all(p.name.startswith("gemm_fusion") for p in points)
    first = points[0]
    assert first.intensity == first.flops / first.hbm_bytes
    assert first.tflops == pytest.approx(first.flops / first.seconds / 1e12)
    assert all(p.seconds >= LATENCIES.kernel_floor_us * 1e-6 for p in points)


def test_roofline_picture_draws_h100_roofs_measured_points_and_kernels() -> None:
    from labkit.core.timing import RooflinePoint

    measured = [
        RooflinePoint(128, "float32", 1e-4, 0.04, 128 / 6),
        RooflinePoint(256, "float32", 5e-4, 0.07, 256 / 6),
    ]
    kernels = [exercises.KernelPoint("gemm", 2e6, 1e5, 1e-6)]
    shown = exercises.roofline_picture(measured, "cpu", kernels, "the step's GEMMs")
    assert shown.title == "Roofline: H100 SXM roofs, cpu measured"
    assert shown.figure is not None
    (ax,) = shown.figure.axes
    labels = [ln.get_label() for ln in ax.lines if not ln.get_label().startswith("_")]
    assert labels == [
        "H100 SXM HBM (datasheet) 3350 GB/s",
        "H100 SXM TF32 (datasheet)",
        "H100 SXM BF16 (datasheet)",
        "H100 SXM FP8 (datasheet)",
        "cpu: best measured",
        "float32 matmul n x n, measured",
        "the step's GEMMs on H100 SXM (modelled)",
    ]
    assert "H100 SXM BF16 (datasheet) 989 TFLOP/s (ridge at 295 FLOPs/byte)" in shown.caption
    assert "cpu: best measured 0.07 TFLOP/s" in shown.caption
    assert "0.04 TFLOP/s at n=128" in shown.caption
    assert "(modelled): 2 TFLOP/s at 20 FLOPs/byte" in shown.caption
    assert figures.overlapping_labels(shown.figure) == []  # no tick label collides


def test_tp_program_checker_reads_the_result() -> None:
    from types import SimpleNamespace

    from hlo_programs import ASYNC

    assert not exercises.check_tp_program(...).attempted
    assert "8 GPUs" in exercises.check_tp_program("compiled").message
    no_model_axis = exercises.check_tp_program(SimpleNamespace(hlo=ASYNC, num_devices=8))
    assert not no_model_axis.passed and "group sizes" in no_model_axis.message
