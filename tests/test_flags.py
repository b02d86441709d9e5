"""labkit.flags against the installed jaxlib: every verdict here comes from a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from labkit.cli import flags as flags_cli
from labkit.xla import flags
from labkit.xla.flags import REGISTRY, REMOVED, FlagError, Verdict

EXAMPLES = [f"--{f.name}={f.example}" for f in REGISTRY.values()]
GONE = [f"--{name}=true" for name in REMOVED]
LHS = "xla_gpu_enable_latency_hiding_scheduler"


@pytest.fixture(scope="module", autouse=True)
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh verdict cache for this module: nothing comes from ~/.cache."""
    path = tmp_path_factory.mktemp("flags-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LABKIT_CACHE_DIR", str(path))
        mp.setattr(flags, "_STATE", {})
        yield path


@pytest.fixture(scope="module")
def checked(cache_dir: Path) -> dict[str, Verdict]:
    """Every registry example, every removed flag and the 2023 list, checked in one call."""
    tokens = EXAMPLES + GONE + list(flags.RECOMMENDED_2023)
    return {v.token: v for v in flags.validate(tokens)}


@pytest.fixture
def spawns(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Commands of the subprocesses labkit.flags starts from here on."""
    seen: list[list[str]] = []
    real = flags._spawn

    def counting(cmd: list[str], *args: Any, **kwargs: Any) -> Any:
        seen.append(list(cmd))
        return real(cmd, *args, **kwargs)

    monkeypatch.setattr(flags, "_spawn", counting)
    return seen


def test_registry_entries_are_complete() -> None:
    for flag in REGISTRY.values():
        assert flag.kind in ("bool", "int", "str", "enum", "enum-list"), flag
        assert "debug_options_flags.cc" in flag.source, flag
        assert 0 < len(flag.what) < 200, flag
        assert flag.field in ("", *REGISTRY), flag  # an old name points at a listed option
    assert not set(REMOVED) & set(REGISTRY)
    assert all(r.replacement and r.source for r in REMOVED.values())


@pytest.mark.parametrize("token", EXAMPLES)
def test_every_registry_flag_is_accepted(checked: dict[str, Verdict], token: str) -> None:
    verdict = checked[token]
    assert verdict.status == "ok", verdict.message
    name = verdict.name
    # Old names (the 2023 xla_gpu_enable_pipelined_*) are XLA_FLAGS-only aliases.
    assert verdict.per_compile == (not REGISTRY[name].field), verdict.message


@pytest.mark.parametrize("token", GONE)
def test_every_removed_flag_is_rejected(checked: dict[str, Verdict], token: str) -> None:
    verdict = checked[token]
    assert verdict.status == "removed", verdict.message
    assert verdict.would_abort
    assert verdict.replacement == REMOVED[verdict.name].replacement
    assert verdict.replacement in verdict.message


def test_recommended_2023_verdicts(checked: dict[str, Verdict]) -> None:
    statuses = [checked[t].status for t in flags.RECOMMENDED_2023]
    assert statuses == ["removed", "ok", "removed", "ok", "ok"]
    assert "0.4.18" in flags.RECOMMENDED_2023_SOURCE
    async_ = checked["--xla_gpu_enable_async_collectives=true"]
    assert "xla_gpu_disable_async_collectives=" in async_.replacement


def test_effects_show_what_a_flag_changes(checked: dict[str, Verdict]) -> None:
    combine = checked["--xla_gpu_all_reduce_combine_threshold_bytes=0"]
    assert combine.effect == (("xla_gpu_all_reduce_combine_threshold_bytes", "0"),)
    old = checked["--xla_gpu_enable_pipelined_all_gather=true"]
    assert old.effect == (("xla_gpu_pipeline_all_gather", "COLLECTIVE_PIPELINING_MODE_ON"),)
    # Already on by default in this jaxlib, so the 2023 flag changes nothing.
    assert checked["--xla_gpu_enable_pipelined_reduce_scatter=true"].effect == ()
    kernels = checked["--xla_gpu_experimental_use_collective_kernels="]
    assert kernels.effect == (("xla_gpu_experimental_use_collective_kernels", ""),)
    assert checked[f"--{LHS}=true"].effect == ((LHS, "true"),)


def test_installed_defaults_are_read_from_jaxlib(checked: dict[str, Verdict]) -> None:
    defaults = flags.installed_defaults()
    assert len(defaults) > 100
    assert int(flags.default_of("xla_gpu_all_reduce_combine_threshold_bytes")) > 0
    assert flags.default_of("xla_gpu_triton_gemm_any") in ("true", "false")
    # left out of the defaults: XLA reads false (and then decides by optimization effort)
    assert flags.default_of(LHS) == f"false ({flags.UNSET})"
    assert flags.default_of("xla_gpu_disable_async_collectives") == f"empty list ({flags.UNSET})"
    assert "ALL_REDUCE" in flags.default_of("xla_gpu_experimental_use_collective_kernels")
    assert flags.default_of("xla_gpu_enable_pipelined_all_gather") == (
        "COLLECTIVE_PIPELINING_MODE_DEFAULT"
    )


def test_misspelling_gets_a_suggestion() -> None:
    (verdict,) = flags.validate(["--xla_gpu_enable_latency_hidding_scheduler=true"])
    assert verdict.status == "unknown" and verdict.would_abort
    assert verdict.suggestion == LHS
    assert f"did you mean --{LHS}?" in verdict.message


def test_bad_values_are_caught() -> None:
    maybe, good, enum, zero = flags.validate(
        [
            f"--{LHS}=maybe",
            "--xla_gpu_all_gather_combine_threshold_bytes=1024",
            "--xla_gpu_disable_async_collectives=ALLREDUCE,FOO",
            "--xla_force_host_platform_device_count=0",
        ]
    )
    assert maybe.status == "bad_value"
    assert "Couldn't interpret value maybe" in maybe.message  # XLA's own words
    assert good.status == "ok"
    assert enum.status == "bad_value"  # XLA names no flag here: found by bisection
    assert zero.status == "bad_value"  # parsed, but then JAX cannot start its CPU backend
    assert "Unable to initialize backend" in zero.message


def test_a_flag_that_takes_a_value_is_bad_without_one() -> None:
    dump, number, boolean, unknown = flags.validate(
        "--xla_dump_to --xla_gpu_all_reduce_combine_threshold_bytes --xla_dump_hlo_as_text "
        "--xla_no_such_flag_here"
    )
    for verdict in (dump, number):  # XLA aborts on both: "Unknown flag in XLA_FLAGS"
        assert verdict.status == "bad_value" and verdict.would_abort, verdict
        assert f"needs a value: write --{verdict.name}=VALUE" in verdict.message
    assert dump.token == "--xla_dump_to"  # as typed, not --xla_dump_to=true
    assert boolean.status == "ok"  # a bare true/false flag means =true
    assert unknown.status == "unknown"


@pytest.mark.parametrize("bad", [None, 3, ["--xla_dump_to=/tmp", None]])
def test_flags_that_are_not_text_say_what_to_pass(bad: Any) -> None:
    with pytest.raises(TypeError, match="a string such as '--xla_dump_to=/tmp/d"):
        flags.validate(bad)


def test_checking_writes_no_dumps(tmp_path: Path) -> None:
    dump = tmp_path / "dumps"
    verdicts = flags.validate([f"--xla_dump_to={dump}", "--xla_dump_hlo_as_text"])
    assert [v.status for v in verdicts] == ["ok", "ok"]
    assert verdicts[0].effect == (("xla_dump_to", str(dump)),)
    assert not dump.exists()


def test_cache_avoids_subprocesses(
    checked: dict[str, Verdict], cache_dir: Path, spawns: list[list[str]]
) -> None:
    again = flags.validate(list(checked))
    assert spawns == []
    assert [v.token for v in again] == list(checked)
    assert (cache_dir / f"flags-{flags.jaxlib_version()}.json").is_file()
    flags._STATE.clear()  # memory gone: the disk cache answers
    assert flags.validate(list(checked)) == again
    assert spawns == []


def test_parse_forms_and_errors() -> None:
    assert flags.parse('--a=1 --b="x y" --c') == [("a", "1"), ("b", "x y"), ("c", "true")]
    assert flags.parse(["--a=", "--b=c=d"]) == [("a", ""), ("b", "c=d")]
    for bad in ["xla_dump_to=/tmp", "-xla_dump_to=/tmp", "--=1", "--a b", '--a="x']:
        with pytest.raises(ValueError, match=r"--name=value|cannot split"):
            flags.parse(bad if bad != "--a b" else [bad])


def test_compile_options_types_and_translations() -> None:
    options = flags.compile_options(
        "--xla_gpu_all_reduce_combine_threshold_bytes=0 --xla_gpu_triton_gemm_any=True "
        "--xla_gpu_enable_pipelined_all_reduce=true --xla_gpu_pipeline_all_gather=on "
        "--xla_gpu_experimental_use_collective_kernels=all_reduce --xla_dump_to=/tmp/d"
    )
    assert options == {
        "xla_gpu_all_reduce_combine_threshold_bytes": 0,
        "xla_gpu_triton_gemm_any": True,  # XLA rejects the string "true" per compile
        "xla_gpu_pipeline_all_reduce": "COLLECTIVE_PIPELINING_MODE_ON",
        "xla_gpu_pipeline_all_gather": "COLLECTIVE_PIPELINING_MODE_ON",
        "xla_gpu_experimental_use_collective_kernels": "COLLECTIVE_KERNEL_ALL_REDUCE",
        "xla_dump_to": "/tmp/d",
    }
    with pytest.raises(FlagError, match="disable_async_collectives"):
        flags.compile_options(["--xla_gpu_enable_async_collectives=true"])
    with pytest.raises(ValueError, match="true or false"):
        flags.compile_options([f"--{LHS}=maybe"])
    with pytest.raises(ValueError, match="XLA_FLAGS only"):
        flags.compile_options(["--xla_gpu_enable_command_buffer=-FUSION"])


def test_compile_options_on_a_real_compile() -> None:
    import jax
    import jax.numpy as jnp

    lowered = jax.jit(lambda x: x @ x.T).lower(jnp.ones((8, 8)))
    good = [
        f"--{LHS}=true",
        "--xla_gpu_enable_pipelined_all_gather=true",
        "--xla_gpu_disable_async_collectives=ALLREDUCE,ALLGATHER",
        "--xla_gpu_experimental_use_collective_kernels=",
        "--xla_gpu_all_reduce_combine_threshold_bytes=0",
    ]
    assert lowered.compile(compiler_options=flags.compile_options(good)) is not None
    with pytest.raises(jax.errors.JaxRuntimeError, match="No such compile option"):
        lowered.compile(compiler_options=flags.compile_options(["--xla_gpu_no_such_flag=1"]))


def test_run_with_flags_returns_the_json_result() -> None:
    code = (
        "import jax, jax.numpy as jnp\n"
        "from labkit.xla.flags import emit\n"
        "emit({'devices': jax.device_count(), 'y': float(jax.jit(lambda x: 2 * x)(3.0))})\n"
    )
    run = flags.run_with_flags(
        ["--xla_force_host_platform_device_count=3"], code, env={"JAX_PLATFORMS": "cpu"}
    )
    assert run.returncode == 0, run.stderr
    assert run.result == {"devices": 3, "y": 6.0}
    assert run.xla_flags == "--xla_force_host_platform_device_count=3"


def test_run_with_flags_refuses_bad_flags_before_launching(spawns: list[list[str]]) -> None:
    with pytest.raises(FlagError, match="would abort JAX") as info:
        flags.run_with_flags(["--xla_gpu_enable_async_all_gather=true"], "print('LAUNCHED')")
    assert info.value.verdicts[0].status == "removed"
    assert not any("print('LAUNCHED')" in arg for cmd in spawns for arg in cmd)
    with pytest.raises(ValueError, match="exactly one"):
        flags.run_with_flags([], "print(1)", module="json.tool")


def test_run_with_flags_module_and_timeout() -> None:
    run = flags.run_with_flags([], module="labkit", args=["flags", "describe", "xla_dump_to"])
    assert run.returncode == 0 and "Directory for XLA's dumps" in run.stdout
    with pytest.raises(TimeoutError, match="did not finish within 1 s"):
        flags.run_with_flags([], "import time; time.sleep(30)", timeout_s=1)


# A compile child as run_compile_child expects one: ``python -m compile_child [ARGS] OUT``.
COMPILE_CHILD = """
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from labkit.xla.flags import report_compile

if sys.argv[1] == "fail":
    sys.exit("this child fails on purpose")
n = jax.device_count()
mesh = jax.make_mesh((n,), ("d",))
total = jax.shard_map(lambda x: jax.lax.psum(x, "d"), mesh=mesh, in_specs=jax.P("d"),
                      out_specs=jax.P())
x = jax.ShapeDtypeStruct((n,), jnp.float32, sharding=jax.NamedSharding(mesh, jax.P("d")))
text = jax.jit(total).lower(x).compile().as_text()
report_compile(text, Path(sys.argv[-1]))
"""


def test_run_compile_child_reads_what_report_compile_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "compile_child.py").write_text(COMPILE_CHILD)
    path = [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv("JAX_NUM_CPU_DEVICES", raising=False)  # the flag sets the count
    out = tmp_path / "program.txt"
    run = flags.run_compile_child(
        ["--xla_force_host_platform_device_count=2"], "compile_child", ["ok"], out, 120
    )
    assert run.hlo == out.read_text() and "all-reduce" in run.hlo
    assert run.summary["num_devices"] == 2  # the flag reached the child
    assert run.summary["collectives"] == {"all-reduce": 1} and run.summary["pipelined"] == 0
    assert run.xla_flags == "--xla_force_host_platform_device_count=2" and run.seconds > 0
    with pytest.raises(RuntimeError, match="exit 1") as failed:
        flags.run_compile_child([], "compile_child", ["fail"], tmp_path / "none.txt", 120)
    assert "this child fails on purpose" in str(failed.value)  # the end of its stderr


def test_cli_exit_codes_and_table(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert flags_cli.main(["check", f"--{LHS}=true"]) == 0
    out = capsys.readouterr().out
    assert "| flag | verdict | note |" in out and f"| --{LHS}=true | ok |" in out
    assert flags_cli.main(["check", f"--{LHS}=true --xla_gpu_enable_async_collectives=true"]) == 1
    assert "| removed |" in capsys.readouterr().out
    monkeypatch.setenv("XLA_FLAGS", "")
    assert flags_cli.main(["check"]) == 0
    assert "nothing to check" in capsys.readouterr().out
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_latency_hidding_scheduler=true")
    assert flags_cli.main(["check"]) == 1
    assert "did you mean" in capsys.readouterr().out
    assert flags_cli.main(["check", "xla_dump_to=/tmp"]) == 1
    assert "--name=value" in capsys.readouterr().err
    assert flags_cli.main([]) == 2


def test_cli_as_a_module() -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "labkit",
            "flags",
            "check",
            "--xla_gpu_enable_async_all_gather=true",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stderr
    assert "removed" in run.stdout and "ALLGATHER" in run.stdout


def test_describe() -> None:
    text = flags.describe("xla_gpu_all_reduce_combine_threshold_bytes")
    assert "default in jaxlib" in text and "debug_options_flags.cc" in text
    assert "removed" in flags.describe("--xla_gpu_enable_async_collectives")
    # the per-compile option, built by compile_options (old names: the option they set)
    per = "per compile: jax.jit(f).lower(...).compile(compiler_options="
    assert per + "{'xla_gpu_all_reduce_combine_threshold_bytes': 0})" in text
    old = flags.describe("xla_gpu_enable_pipelined_all_gather")
    assert per + "{'xla_gpu_pipeline_all_gather': 'COLLECTIVE_PIPELINING_MODE_ON'})" in old
    assert "XLA_FLAGS only" in old
    assert per + "{'xla_cpu_enable_fast_math': False})" in flags.describe(
        "xla_cpu_enable_fast_math"
    )
    with pytest.raises(FlagError, match=f"did you mean --{LHS}"):
        flags.describe("xla_gpu_enable_latency_hidding_scheduler")


def test_importing_flags_does_not_import_jax() -> None:
    code = "import sys, labkit.xla.flags; sys.exit('jax' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_a_flag_given_twice_says_the_last_wins() -> None:
    first, other, last = flags.validate(f"--{LHS}=false --xla_dump_hlo_as_text --{LHS}=true")
    assert first.status == last.status == other.status == "ok"
    assert f"a later --{LHS} overrides this one (the last wins)" in first.message
    assert "given 2 times: this last one wins" in last.message
    assert "given" not in other.message


def test_a_value_split_at_a_space_says_how_to_quote_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(ValueError, match="split at a space") as split:
        flags.parse("--xla_dump_to=/tmp/a b")
    assert '--xla_dump_to="/tmp/a b"' in str(split.value)
    assert flags.parse('--xla_dump_to="/tmp/a b"') == [("xla_dump_to", "/tmp/a b")]
    assert flags_cli.main(["check", "--xla_dump_to=/tmp/a b"]) == 1
    err = capsys.readouterr().err
    assert "split at a space" in err and "bad flag" not in err


def test_check_warn_only_warns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XLA_FLAGS", f"--{LHS}=true")
    assert flags_cli.main(["check", "--warn"]) == 0
    assert capsys.readouterr() == ("", "")  # good flags: make lab says nothing
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to")
    assert flags_cli.main(["check", "--warn"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "| --xla_dump_to | bad_value |" in err
    assert flags_cli.LAB_WARNING in err
    makefile = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    lab = makefile[makefile.index("\nlab: ") :].split("\n\n")[0]
    assert lab.index("-m labkit flags check --warn") < lab.index("-m jupyter lab")  # make lab
