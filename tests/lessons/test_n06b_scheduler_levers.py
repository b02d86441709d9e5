"""labkit.lessons.n06b_scheduler_levers: profiles, thunks, collective matmuls, effort levels."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hlo_programs import ASYNC

from labkit.gpt.compile import same_program_options
from labkit.lessons import n06b_scheduler_levers as n06b
from labkit.xla import flags, hlo, predict
from labkit.xla.compare import identical, metrics

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = [
    ROOT / "notebooks" / "06b_scheduler_levers.md",
    ROOT / "notebooks" / "solutions" / "06b_scheduler_levers.md",
]
HIGH = "PGLE_STRICTNESS_LEVEL_ERROR"


# ---------------------------------------------------------------------------------------
# Every flag the notebook uses is one this jaxlib knows


def test_every_flag_in_the_notebooks_is_listed() -> None:
    import pkgutil

    import labkit.xla

    modules = {m.name for m in pkgutil.iter_modules(labkit.xla.__path__)}  # xla_estimate, ...
    named = {m for path in NOTEBOOKS for m in re.findall(r"\bxla_[a-z0-9_]+", path.read_text())}
    named -= modules
    listed = set(n06b.FLAGS) | set(n06b.REMOVED_FLAGS)
    assert named, "the notebooks name no XLA flag"
    assert named <= listed, f"add to n06b.FLAGS: {sorted(named - listed)}"


def test_every_flag_used_is_accepted_by_this_jaxlib() -> None:
    """What `labkit flags check` does: a flag this jaxlib removed fails here. The options
    every compile adds (same_program_options) are used too."""
    used = {**n06b.FLAGS, **same_program_options()}
    verdicts = flags.validate([f"--{name}={value}" for name, value in used.items()])
    bad = {v.name: v.message for v in verdicts if v.status != "ok"}
    assert not bad, bad


def test_flags_named_as_gone_are_gone() -> None:
    tokens = [f"--{name}={value}" for name, value in n06b.REMOVED_FLAGS.items()]
    assert all(v.status in ("removed", "unknown") for v in flags.validate(tokens))


def test_checker_levels_are_this_jaxlibs_enum() -> None:
    assert flags.default_of(n06b.PGLE_CHECKER) in n06b.CHECKER_LEVELS
    assert all(
        v.status == "ok"
        for v in flags.validate([f"--{n06b.PGLE_CHECKER}={x}" for x in n06b.CHECKER_LEVELS])
    )


# ---------------------------------------------------------------------------------------
# Profiles


def test_profile_text_is_a_labelled_proto(tmp_path: Path) -> None:
    text = n06b.profile_text({"fusion.3": 12.5, "all-reduce-start": 0})
    assert text.splitlines() == [
        "# SYNTHETIC: written, not measured",
        'costs { name: "fusion.3" cost_us: 12.5 }',
        'costs { name: "all-reduce-start" cost_us: 0 }',
    ]
    path = n06b.write_profile({"a": 1}, tmp_path, "p")
    assert path.name == "p.pbtxt" and 'name: "a"' in path.read_text()
    with pytest.raises(ValueError, match="at least one"):
        n06b.profile_text({})
    with pytest.raises(ValueError, match="plain HLO names"):
        n06b.profile_text({'bad"name': 1})


def test_missing_instructions() -> None:
    msg = "INVALID_ARGUMENT: Found 28 missing instructions. Discarding the profile."
    assert n06b.missing_instructions(msg) == 28
    with pytest.raises(ValueError, match="accuracy-checker"):
        n06b.missing_instructions("something else")


@pytest.fixture(scope="module")
def programs() -> dict[str, str]:
    """The MLP step without a profile, with the target expensive (as a file), cheap (bytes)."""
    import tempfile

    target = "all-reduce-start.2"
    with tempfile.TemporaryDirectory() as tmp:
        path = n06b.write_profile({target: 10000.0}, tmp)
        out = {
            "base": n06b.compile_mlp().hlo,
            "expensive": n06b.compile_mlp({n06b.PGLE_PATH: str(path)}).hlo,
            "expensive bytes": n06b.compile_mlp({"fdo_profile": path.read_bytes()}).hlo,
        }
    out["cheap"] = n06b.compile_mlp({"fdo_profile": n06b.profile_text({target: 0}).encode()}).hlo
    return out


def test_a_profile_moves_the_schedule(programs: dict[str, str]) -> None:
    target = "all-reduce-start.2"
    base, hi, lo = programs["base"], programs["expensive"], programs["cheap"]
    assert identical(hi, programs["expensive bytes"])  # a file or fdo_profile: one program
    counts = {k: n06b.between_counts(v) for k, v in programs.items()}
    assert len(counts["base"]) == 5 and n06b.sync_collectives(base) == []
    assert counts["expensive"][target] > counts["base"][target]
    assert any(counts["expensive"][s] < n for s, n in counts["base"].items() if s != target)
    assert target in counts["cheap"] and len(n06b.sync_collectives(lo)) == 1
    rows = n06b.schedule_rows({"base": base, "cheap": lo})
    assert [r["cheap"] for r in rows].count("sync") == 1
    assert len(n06b.kernels_between(hi, target)) == counts["expensive"][target]
    with pytest.raises(ValueError, match="no async start"):
        n06b.kernels_between(lo, n06b.sync_collectives(lo)[0])


def test_verdict_rows_use_the_cost_models(programs: dict[str, str]) -> None:
    rows = {r["program"]: r for r in n06b.verdict_rows(programs)}
    assert rows["expensive"]["hidden us"] == pytest.approx(rows["base"]["hidden us"])
    assert rows["cheap"]["exposed"] == rows["base"]["exposed"] + 1
    assert re.fullmatch(r"[\d.]+-[\d.]+", rows["base"]["step us (model)"])


def test_accuracy_checker_error(programs: dict[str, str]) -> None:
    recorded = n06b.recorded_profile(programs["cheap"])
    assert set(n06b.sync_collectives(programs["cheap"])) <= set(recorded)
    with pytest.raises(Exception, match="Found 1 missing instructions"):
        n06b.compile_mlp(
            {"fdo_profile": n06b.profile_text(recorded).encode(), n06b.PGLE_CHECKER: HIGH}
        )
    one = {"fdo_profile": n06b.profile_text({"all-reduce-start.2": 1}).encode()}
    with pytest.raises(Exception, match=f"Found {len(recorded) - 1} missing"):
        n06b.compile_mlp({**one, n06b.PGLE_CHECKER: HIGH})
    fixed = n06b.check_profile_fix({"all-reduce-start": 5.0}, recorded)
    assert fixed.passed, fixed.message


def test_check_profile_fix_with_a_fake_compile() -> None:
    seen: list[dict] = []

    def fake(options: dict) -> None:
        seen.append(options)
        if b'"missing"' not in options["fdo_profile"]:
            raise RuntimeError("INVALID_ARGUMENT: Found 1 missing instructions.")

    assert n06b.check_profile_fix({"missing": 1.0}, {"a": 1.0}, fake).passed
    assert seen[0][n06b.PGLE_CHECKER] == HIGH and b'"a"' in seen[0]["fdo_profile"]
    wrong = n06b.check_profile_fix({"other": 1.0}, {"a": 1.0}, fake)
    assert not wrong.passed and "before" in wrong.message
    assert not n06b.check_profile_fix([1], {"a": 1.0}, fake).passed
    assert not n06b.check_profile_fix(..., {"a": 1.0}, fake).attempted


# ---------------------------------------------------------------------------------------
# Command buffers

SEQ_ON = """\
000: kCommandBuffer [source | next=004 (1)] 
    001: kCustomKernel [source | sink] fusion_1 grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
004: kAsyncStart    [prev=000 (2) | next=000 (3)] stream=communication_stream[0], async_id=4
    005: kAllReduce [source | sink] kAllReduce
006: kCustomKernel  [prev=004 (2) | next=008 (2)] fusion_2 grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
008: kAsyncDone     [source | sink] async_id=4
"""  # noqa: E501, W291


def test_thunk_rows() -> None:
    assert n06b.thunk_rows(SEQ_ON) == [
        {"launch": 1, "thunk": "kCommandBuffer", "runs": "1 x kCustomKernel"},
        {"launch": 2, "thunk": "kAsyncStart", "runs": "kAllReduce"},
        {"launch": 3, "thunk": "kCustomKernel", "runs": "fusion_2"},
        {"launch": 4, "thunk": "kAsyncDone", "runs": ""},
    ]


def test_check_all_kernels_recorded_with_a_fake_compile() -> None:
    every = SEQ_ON.replace(
        "006: kCustomKernel ", "007: kCommandBuffer [x] \n    006: kCustomKernel"
    )

    def fake(options: dict, folder: Path) -> str:
        assert folder.is_dir()
        return every if options.get(n06b.GRAPH_MIN) == 1 else SEQ_ON

    assert n06b.check_all_kernels_recorded({n06b.GRAPH_MIN: 1}, fake).passed
    wrong = n06b.check_all_kernels_recorded({}, fake)
    assert not wrong.passed and "1 kernels are still" in wrong.message
    assert not n06b.check_all_kernels_recorded("min", fake).passed


def test_check_all_kernels_recorded_compiles_for_real() -> None:
    assert n06b.check_all_kernels_recorded({n06b.GRAPH_MIN: 1}).passed
    assert not n06b.check_all_kernels_recorded({}).passed


# ---------------------------------------------------------------------------------------
# Collective matmuls


@pytest.mark.parametrize("fn", [n06b.ring_matmul, n06b.ring_matmul_unrolled])
def test_ring_matmul_computes_the_product(fn: object) -> None:
    import jax
    from jax.sharding import PartitionSpec as P

    from labkit.core.mesh import make_mesh

    mesh = make_mesh((8,), ("x",), devices=jax.devices("cpu"))
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32)
    specs = {"in_specs": (P("x", None), P(None, "x")), "out_specs": P(None, "x")}
    got = jax.jit(jax.shard_map(fn, mesh=mesh, **specs))(x, w)
    np.testing.assert_allclose(np.asarray(got), x @ w, rtol=1e-5, atol=1e-5)


def test_matmul_programs() -> None:
    shape = (2048, 4096, 4096)
    progs = {
        "default": n06b.compile_xla_matmul(*shape).hlo,
        "windowed": n06b.compile_xla_matmul(*shape, {n06b.WINDOWED: 0}).hlo,
        "one stream": n06b.compile_xla_matmul(
            *shape, {n06b.WINDOWED: 0, n06b.MULTI_STREAM: False}
        ).hlo,
        "ring": n06b.compile_ring_matmul(*shape).hlo,
        "unrolled": n06b.compile_ring_matmul(*shape, n06b.ring_matmul_unrolled).hlo,
    }
    rows = {r["program"]: r for r in n06b.matmul_rows(progs)}
    assert (rows["default"]["collectives"], rows["default"]["sync"]) == ("1 all-gather", 1)
    assert (rows["windowed"]["async"], rows["windowed"]["GEMM kernels"]) == (7, 8)
    # one stream: its permute sits in a true/false conditional, on 8 loop trips; the model
    # reads the branches and charges the permute on every trip
    one = predict.predict(progs["one stream"])
    assert (rows["one stream"]["loop trips"], one.collectives) == ("8", 8)
    assert rows["one stream"]["kernels run"] == one.kernels > rows["default"]["kernels run"]
    assert (rows["ring"]["loop trips"], rows["ring"]["async"]) == ("7", 1)
    assert (rows["unrolled"]["GEMM kernels"], rows["unrolled"]["sync"]) == (1, 7)  # dot merger
    assert hlo.collective_counts(progs["ring"]) == {"collective-permute": 1}


# ---------------------------------------------------------------------------------------
# Effort levels


def test_start_levels_rejects_unknown_levels() -> None:
    with pytest.raises(ValueError, match="O4"):
        n06b.start_levels(["O4"])
    with pytest.raises(TypeError, match="LEVELS"):
        n06b.start_levels("O1")


def test_levels_in_fresh_processes_and_the_stale_compile() -> None:
    future = n06b.start_levels(["O0", "O1"], parallel=2)
    default, stale, seconds = n06b.stale_level_compile("O1")
    levels = future.result()
    assert identical(default.hlo, stale.hlo) and seconds < 2  # the cached executable
    rows = {r["level"]: r for r in n06b.level_rows(levels, default.hlo)}
    assert rows["O0"]["= default program"] and rows["O0"]["pipelined"] == 0
    assert not rows["O1"]["= default program"] and rows["O1"]["pipelined"] > 0
    assert all(r["memory level = default program"] for r in rows.values())
    assert all(r["compile CPU s"] > 0 for r in rows.values())
    per_compile = n06b.level_per_compile("O1")  # honoured per compile, in this process
    o1 = next(r for r in levels if r.level == "O1")
    assert identical(per_compile.hlo, o1.hlo) and not identical(per_compile.hlo, default.hlo)


def test_pipelined_at_two_layers() -> None:
    def fake() -> str:
        return ASYNC  # one async all-reduce, marked pipelined

    assert n06b.check_pipelined_at_two_layers(1, compile_hlo=fake).passed
    assert not n06b.check_pipelined_at_two_layers(9, compile_hlo=fake).passed
    assert not n06b.check_pipelined_at_two_layers("many", compile_hlo=fake).passed
    assert not n06b.check_pipelined_at_two_layers(..., compile_hlo=fake).attempted
    real = n06b.level_per_compile("O1", n06b.EXERCISE_LAYERS).hlo
    assert n06b.check_pipelined_at_two_layers(metrics(real)["pipelined"]).passed


# ---------------------------------------------------------------------------------------
# GPU only


def test_gpu_measurements_refuse_to_simulate() -> None:
    with pytest.raises(RuntimeError, match="GPU"):
        n06b.measure_auto_pgle()
    with pytest.raises(RuntimeError, match="2 or more GPUs"):
        n06b.measure_nccl()
    assert n06b.nccl_env("NVLS off") == {"NCCL_NVLS_ENABLE": "0"}
    with pytest.raises(ValueError, match="choose from"):
        n06b.nccl_env("turbo")
    assert {k["variable"] for k in n06b.NCCL_KNOBS} >= {"NCCL_NVLS_ENABLE", "NCCL_PROTO"}


def test_all_reduce_child_runs_as_a_module_on_cpu_devices() -> None:
    """The child of measure_nccl (``python -m ... nccl``), here on 4 CPU devices: no NCCL."""
    env = {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "4"}
    seconds, devices = n06b.time_all_reduce(1 << 12, repeats=3, env=env, timeout_s=120)
    assert devices == 4 and 0 < seconds < 10
    with pytest.raises(RuntimeError, match="exit 1") as failed:  # the child's timeit refuses
        n06b.time_all_reduce(1 << 12, repeats=0, env=env, timeout_s=120)
    assert "need repeats >= 1" in str(failed.value)


def _on_gpu(code: str) -> str:
    """Run ``code`` in a fresh process in GPU mode (this one is set up for CPU)."""
    import subprocess
    import sys

    head = "from labkit.core import env; env.setup(mode='gpu')\n"
    out = subprocess.run(
        [sys.executable, "-c", head + code], capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.gpu
def test_automatic_pgle_runs_on_a_gpu() -> None:
    code = (
        "from labkit.lessons import n06b_scheduler_levers as n\n"
        "t = n.measure_auto_pgle(profiling_runs=1, repeats=3, width=512, layers=2)\n"
        "print(sorted(t), min(x.median for x in t.values()) > 0)"
    )
    assert _on_gpu(code) == "['PGLE off', 'automatic PGLE'] True"


@pytest.mark.gpu
def test_nccl_settings_run_where_there_are_two_gpus() -> None:
    code = (
        "import jax\nfrom labkit.lessons import n06b_scheduler_levers as n\n"
        "if jax.device_count() < 2: print('one GPU')\n"
        "else: print(sorted(n.measure_nccl(nbytes=1 << 20, repeats=3)))"
    )
    last = _on_gpu(code)
    assert last == "one GPU" or last == str(sorted(n06b.NCCL_SETTINGS))


def test_nvls_rows_set_nccls_model_beside_the_kits_ring() -> None:
    """The kit's ring (5 us + 2(n-1)/n B over 450 GB/s) beside NCCL's ring and NVLS."""
    small, large = n06b.nvls_rows([131072, 2**26])
    assert small["kit ring us"] == predict.round_sig(5.0 + 1.75 * 131072 / 450e3)
    assert large["NVLS ring-equivalent bytes"] * 2 == large["ring bytes sent"]
    assert large["ring bytes sent"] == round(1.75 * 2**26)
    assert large["NCCL NVLS us"] < large["kit ring us"] < large["NCCL ring us"]
    assert small["kit ring us"] < small["NCCL NVLS us"] < small["NCCL ring us"]


def test_sol_rows_pair_each_collective_with_xlas_window(tmp_path: Path) -> None:
    """The MLP step's schedule dump: every collective the kit judges has XLA's window."""
    from labkit.xla import xla_estimate, xla_schedule

    base = n06b.compile_mlp(xla_schedule.dump_options(tmp_path))
    est = xla_estimate.estimate_folder(tmp_path, base.hlo)
    assert est is not None
    rows = n06b.sol_rows(base.hlo, est)
    assert len(rows) == 5 and {r["XLA's model"] for r in rows} == {"collective interpolator"}
    assert all(isinstance(r["XLA window us"], float) for r in rows)


def test_the_model_charges_a_dynamic_update_slice_its_whole_buffer_and_partials() -> None:
    text = n06b.compile_xla_matmul(2048, 4096, 4096, {n06b.WINDOWED: 0}).hlo
    dus = n06b.dus_bytes(text)
    assert (dus["operand"], dus["output"], dus["update"]) == (
        2048 * 512 * 2,
        2048 * 512 * 2,
        256 * 512 * 2,
    )
    assert dus["partials"] == 16 * 256 * 512 * 4  # f32 split-K partials, 16 of them
    assert 0 <= dus["charged"] - (dus["operand"] + dus["output"] + dus["partials"]) < 64
    with pytest.raises(ValueError, match="no dynamic-update-slice"):
        n06b.dus_bytes(n06b.compile_xla_matmul(2048, 4096, 4096).hlo)


def test_collectives_recorded_prediction() -> None:
    from labkit.xla.flags import default_of

    recorded = "COLLECTIVES" in str(default_of(n06b.COMMAND_BUFFER)).split(",")
    assert n06b.check_collectives_recorded(recorded).passed
    assert not n06b.check_collectives_recorded(not recorded).passed
