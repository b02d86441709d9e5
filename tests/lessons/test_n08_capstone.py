"""labkit.lessons.n08_capstone: training, resume, sampling, prediction, profile, checkers."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hlo_programs import ASYNC

from labkit.gpt.config import GPTConfig, flops_per_token
from labkit.lessons import n08_capstone as lesson
from labkit.parallel import checkpoint


def test_step_flops_checker() -> None:
    cfg = GPTConfig.preset("small")
    right = flops_per_token(cfg) * 16 * cfg.seq_len
    assert lesson.check_step_flops(right).passed
    wrong = lesson.check_step_flops(right // 2)
    assert not wrong.passed and wrong.attempted and "flops_per_token" in wrong.message
    assert not lesson.check_step_flops("lots").passed
    assert not lesson.check_step_flops(...).attempted


def test_attention_share_checker() -> None:
    cfg = GPTConfig.preset("small")
    share = 12 * cfg.num_layers * cfg.seq_len * cfg.d_model / flops_per_token(cfg)
    ok = lesson.check_attention_share(share)
    assert ok.passed and "12 L T d" in ok.message
    assert not lesson.check_attention_share(share * 2).passed
    assert not lesson.check_attention_share(None).attempted


def test_best_config_checker_respects_the_memory_limit() -> None:
    from types import SimpleNamespace as NS

    predicted = {
        ("dp", "bf16"): NS(upper_s=1.0),
        ("fsdp", "bf16"): NS(upper_s=2.0),
        ("fsdp", "f32"): NS(upper_s=3.0),
    }
    memory = {
        ("dp", "bf16"): NS(total=100),
        ("fsdp", "bf16"): NS(total=10),
        ("fsdp", "f32"): NS(total=10),
    }
    assert lesson.check_best_config(("dp", "bf16"), predicted, memory, 200).passed
    assert lesson.check_best_config(("fsdp", "bf16"), predicted, memory, 50).passed
    wrong = lesson.check_best_config(("dp", "bf16"), predicted, memory, 50)
    assert not wrong.passed and wrong.attempted and "limit" in wrong.message
    assert not lesson.check_best_config("dp", predicted, memory, 50).passed
    assert not lesson.check_best_config(..., predicted, memory, 50).attempted


def test_choices_are_checked() -> None:
    with pytest.raises(ValueError, match="choose one of"):
        lesson.make_config("tiny", "fp16")
    with pytest.raises(ValueError, match="choose one of"):
        lesson.make_local_mesh("pp")
    assert lesson.make_config("tiny", "fp8").dot_general is not None
    assert str(lesson.make_config("tiny", "bf16").dtype) == "bfloat16"


def test_train_checkpoint_resume_is_exact_and_sample(tmp_path) -> None:
    run = lesson.build_run("tiny", "fsdp", "f32", 8, 3e-3)
    state, _, _ = run.train(run.init(), 0, 2)
    checkpoint.save(tmp_path, state, 2)
    seen = []
    state, ref, times = run.train(state, 2, 2, lambda i, loss, s: seen.append(i))
    assert seen == [2, 3] and len(times) == 2
    restored, step = checkpoint.restore(tmp_path, run.abstract_state)
    assert step == 2 and checkpoint.latest_step(tmp_path) == 2
    _, again, _ = run.train(restored, step, 2)
    assert again == ref
    text = lesson.sample(run, state["params"], "ab", 5)
    assert len(text) >= 1
    assert "loss" in lesson.progress_line(0, 4, 1.0, 10.0)


def test_restore_without_checkpoint_says_what_to_do(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"checkpoint\.save"):
        checkpoint.restore(tmp_path, {})


def test_compare_configs_predicts_and_reads_compiled_memory() -> None:
    predicted, held = lesson.compare_configs("tiny", [("dp", "f32"), ("fsdp", "f32")], 32)
    dp, fsdp = predicted["dp", "f32"], predicted["fsdp", "f32"]
    assert dp.kernels > 100 and dp.lower_s >= dp.floor_s > dp.math_s  # floor-bound
    assert dp.upper_s >= dp.lower_s and fsdp.collectives > dp.collectives
    assert held["fsdp", "f32"].argument < held["dp", "f32"].argument  # the state is sharded
    _, state, batch = lesson.h100_setup("tiny", "dp", "f32", 32)
    assert held["dp", "f32"].argument == lesson.bytes_per_gpu(state) + lesson.bytes_per_gpu(batch)


def test_estimate_compile_is_the_h100_program_and_the_range_scales() -> None:
    """XLA's estimate comes from a compile of the very program h100_compile gives, and
    range_at scales both guessed constants: at 1 it is predict's range, at 2 the high end
    grows by at most one floor per kernel and one alpha per collective."""
    from labkit.core.hardware import LATENCIES
    from labkit.xla import predict

    result, est = lesson.h100_compile_with_estimate("tiny", "dp", "f32", "default", 32)
    assert result.hlo == lesson.h100_compile("tiny", "dp", "f32", "default", 32).hlo
    assert est is not None and est.kernels == predict.predict(result.hlo).kernels
    base, doubled = lesson.range_at(result.hlo, 1.0), lesson.range_at(result.hlo, 2.0)
    assert base == predict.predict(result.hlo)
    most = base.kernels * LATENCIES.kernel_floor_us + base.collectives * LATENCIES.collective_us
    assert 0 < (doubled.upper_s - base.upper_s) * 1e6 <= most + 1e-6
    assert doubled.floor_s == pytest.approx(2 * base.floor_s)


def test_bound_term_checker_names_the_largest_of_the_four_terms() -> None:
    """08.p1 offers every term of the low end, exposed communication included; the tiny dp
    step is floor-bound, and every spelling of another term is a wrong, attempted answer."""
    assert set(lesson.BOUND_TERMS.values()) == {"math", "memory", "communication", "floors"}
    args = ("tiny", "dp", "f32", "default", 32)
    assert lesson.check_bound_term("floors", *args).passed
    for other in ("math", "memory", "communication", "exposed"):
        fb = lesson.check_bound_term(other, *args)
        assert fb.attempted and not fb.passed
    assert "answer one of" in lesson.check_bound_term("latency", *args).message
    assert not lesson.check_bound_term(..., *args).attempted


def test_trace_reading(tmp_path) -> None:
    events = [
        {"ph": "X", "name": "dot", "dur": 5},
        {"ph": "X", "name": "dot", "dur": 3},
        {"ph": "X", "name": "$python.py:1 f", "dur": 100},
        {"ph": "i", "name": "mark"},
        {"ph": "X", "name": "add", "dur": 1},
    ]
    path = tmp_path / "plugins" / "profile" / "host.trace.json.gz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    found = lesson.trace_events(tmp_path)
    assert len(found) == 4
    assert lesson.top_ops(found, 2) == [("dot", 8.0, 2), ("add", 1.0, 1)]
    assert lesson.top_ops(found, 1, python=True)[0][0].startswith("$")
    # only the program's own instructions: the runtime's "dot" event is not one of ASYNC's
    program_events = [
        *found,
        {"ph": "X", "name": "f", "dur": 2},
        {"ph": "X", "name": "ar", "dur": 4},
    ]
    assert lesson.top_ops(program_events, 5, program=ASYNC) == [("ar", 4.0, 1), ("f", 2.0, 1)]
    with pytest.raises(FileNotFoundError, match="create_perfetto_trace"):
        lesson.trace_events(tmp_path / "empty")


def test_state_bytes_and_same_values() -> None:
    import jax

    x = jax.numpy.ones((8, 4), jax.numpy.float32)
    assert lesson.bytes_per_gpu({"a": x}) == 8 * 4 * 4
    assert checkpoint.same_values({"a": x}, {"a": np.ones((8, 4), np.float32)})
    assert not checkpoint.same_values({"a": x}, {"b": x})


@pytest.mark.parametrize("ending", ["passes", "fails"])
def test_the_checkpoint_folder_goes_with_the_kernel(tmp_path: Path, ending: str) -> None:
    """08 saves and restores in ``scratch_dir("capstone-ckpt-")``: gone at exit, after errors."""
    code = (
        "import sys\n"
        "from labkit.core.env import scratch_dir, setup\n"
        "setup(cpu_devices=8, mode='cpu')\n"
        "import jax, jax.numpy as jnp\n"
        "from labkit.parallel import checkpoint\n"
        "root = scratch_dir('capstone-ckpt-')\n"
        "state = {'params': {'w': jnp.ones((8, 4))}, 'step': jnp.int32(12)}\n"
        "print(checkpoint.save(root, state, 12), flush=True)\n"
        "abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,"
        " sharding=x.sharding), state)\n"
        "restored, step = checkpoint.restore(root, abstract)\n"
        "assert step == 12 and bool((restored['params']['w'] == 1).all())\n"
        "if sys.argv[1] == 'fails':\n    raise RuntimeError('a later cell failed')\n"
    )
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    out = subprocess.run(
        [sys.executable, "-c", code, ending],
        capture_output=True,
        text=True,
        env={**env, "TMPDIR": str(tmp)},
        timeout=300,
    )
    assert out.returncode == (0 if ending == "passes" else 1), out.stderr
    saved = Path(out.stdout.split()[-1])
    assert saved.name == "step_12" and tmp in saved.parents  # it was written there
    assert list(tmp.iterdir()) == []  # and nothing is left, folder or file


def test_capstone_checker_reads_the_answer_before_compiling() -> None:
    assert not lesson.check_capstone(...).attempted
    assert "keys" in lesson.check_capstone(("dp", "bf16", "default")).message
    wrong = {"strategy": "dp", "precision": "bf17", "flags": "default"}
    assert "unknown precision 'bf17'" in lesson.check_capstone(wrong).message
    assert len(set(lesson.CAPSTONE.candidates())) == 6


@pytest.mark.aot
def test_capstone_ranks_a_choice_against_what_it_compiled() -> None:
    task = lesson.Task(preset="tiny", batch_size=32, limit_bytes=10**12)  # everything fits
    best = min(lesson.CAPSTONE.candidates(), key=lambda c: lesson.standing(c, task).upper_s)
    answer = dict(zip(("strategy", "precision", "flags"), best, strict=True))
    fb = lesson.check_capstone(answer, task)
    assert fb.passed and "1 of the 6 fitting" in fb.message
    tight = lesson.Task(preset="tiny", batch_size=32, limit_bytes=1)
    assert "over the" in lesson.check_capstone(answer, tight).message
