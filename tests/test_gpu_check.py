"""labkit gpu-check: its plan, report and dry run on CPU; the measured parts' arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.cli import gpu_check
from labkit.cli.parameters import problem
from labkit.cli.usage import UsageError
from labkit.gpt import gpu_run
from labkit.runner import preflight
from labkit.xla.xla_schedule import SCHEDULE_SUFFIX

SMI = """NVIDIA H100 80GB HBM3, 9.0, 570.124.06, 81559
NVIDIA A100-SXM4-80GB, 8.0, 535.54.03, 81920
"""
H100, A100 = gpu_check.parse_smi(SMI)
NOTEBOOKS = preflight.notebooks(solutions=False)


def test_nvidia_smi_lines_are_read() -> None:
    assert H100 == gpu_check.Gpu("NVIDIA H100 80GB HBM3", (9, 0), "570.124.06", 81559)
    assert A100.capability == (8, 0)
    with pytest.raises(ValueError, match="unexpected nvidia-smi line"):
        gpu_check.parse_smi("NVIDIA H100, 9.0")


def test_eight_h100s_get_every_part() -> None:
    steps, notes = gpu_check.plan([H100] * 8, NOTEBOOKS)
    parts = [s.part for s in steps]
    assert parts.count("notebook") == len(NOTEBOOKS) > 10
    assert parts.count("step") == len(gpu_run.CASES) and parts.count("fp8") == 1
    assert parts.count("autotune") == len(gpu_check.PRESETS) and notes == []
    assert sum(s.budget_s for s in steps) <= gpu_check.BUDGET_S + 1


def test_one_a100_skips_fp8_and_the_multi_gpu_cases_and_says_why() -> None:
    steps, notes = gpu_check.plan([A100], NOTEBOOKS)
    assert [s.what for s in steps if s.part == "step"] == [
        "time the GPT step: DP, XLA defaults on 1 GPU(s)"
    ]
    assert not [s for s in steps if s.part == "fp8"]
    text = "\n".join(notes)
    assert "sm_80) has no FP8 tensor cores" in text and "1 GPU(s), not 8" in text
    assert "not an H100 or H200" in text and "FSDP, XLA defaults: needs 2+ GPUs" in text


def test_no_gpu_or_too_many_is_refused() -> None:
    with pytest.raises(ValueError, match="no NVIDIA GPU"):
        gpu_check.plan([], NOTEBOOKS)
    with pytest.raises(ValueError, match="written for 1 to 8"):
        gpu_check.plan([H100] * 9, NOTEBOOKS)


def test_gpu_parameters_are_parameters_of_their_notebooks() -> None:
    by_stem = {n.stem: n for n in NOTEBOOKS}
    assert set(gpu_check.GPU_PARAMETERS) <= set(by_stem)
    for stem, notebook in by_stem.items():
        for name, value in gpu_check.gpu_parameters(notebook).items():
            assert problem(notebook, name, value, f"{name}={value}") is None, (stem, name)


def test_dry_run_says_what_it_would_do_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(gpu_check, "find_gpus", list)
    assert gpu_check.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "no NVIDIA GPU here: the plan is for 8 H100s; nothing was run" in out
    assert "papermill 05_fp8.ipynb -y 'MODE: \"gpu\"' -y 'GPU_GEMM_SIZE: 8192'" in out
    with pytest.raises(UsageError, match="run on a GPU machine, or --dry-run"):
        gpu_check.main([])


def test_the_report_renders_the_measured_rows(tmp_path: Path) -> None:
    steps, notes = gpu_check.plan([A100], NOTEBOOKS[:1])
    row = gpu_run.StepResult("DP, XLA defaults", 1, 250.0, 170.0, 180.0, None, 0.12, "above")
    text = gpu_check.render([A100], steps, notes, {"Steps": [row.__dict__], "FP8": "skipped"})
    assert "| DP, XLA defaults | 1 | 250.0 | 170.0 | 180.0 |" in text and "## FP8" in text


def test_the_measured_parts_arithmetic() -> None:
    assert gpu_run.verdict(250, 170, 180) == "above the model's range (1.39x its ceiling)"
    assert gpu_run.verdict(175, 170, 180) == "within the model's range"
    assert gpu_run.verdict(100, 170, 180).startswith("below")
    assert gpu_run.mfu(989e12 * 0.5, 1.0, 989) == pytest.approx(0.5)
    assert gpu_run.fp8_supported((9, 0)) and gpu_run.fp8_supported((8, 9))
    assert not gpu_run.fp8_supported((8, 0))
    kept, skipped = gpu_run.cases_for(8)
    assert len(kept) == len(gpu_run.CASES) and skipped == []


def test_measuring_needs_a_gpu() -> None:
    with pytest.raises(gpu_run.NoGpu, match="JAX sees no GPU"):
        gpu_run.measure_steps()


def test_xla_estimate_is_read_from_the_timed_compiles_own_schedule_dump(tmp_path: Path) -> None:
    from xla_schedule_fixture import LOOPED, LOOPED_SCHEDULE, STEP_US

    assert gpu_run.xla_estimate_us(tmp_path, LOOPED) is None  # no dump: no estimate
    (tmp_path / f"looped{SCHEDULE_SUFFIX}").write_text(LOOPED_SCHEDULE)
    found = gpu_run.xla_estimate_us(tmp_path, LOOPED)
    assert found is not None and abs(found - STEP_US) < 1e-6
