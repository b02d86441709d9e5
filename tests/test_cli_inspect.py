"""``labkit inspect FILE.py[:NAME]``: exit codes, short errors, text and JSON reports."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from labkit.cli import main
from labkit.xla import trace_events
from labkit.xla.inspect_schema import SCHEMA

PROGRAM = '''\
"""A tiny program in the file convention."""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

MESH = "data=8"


def step(x, w):
    return jnp.tanh(x @ w).sum()


def example_args(mesh):
    return (
        jax.ShapeDtypeStruct((64, 128), jnp.bfloat16, sharding=P("data")),
        jax.ShapeDtypeStruct((128, 128), jnp.bfloat16),
    )
'''


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.py"
    path.write_text(PROGRAM)
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["inspect", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_report(program: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, str(program), "--json", "--mesh", "data=4")
    assert code == 0, err
    data = json.loads(out)
    jsonschema.validate(data, SCHEMA)
    assert data["program"]["name"] == "tiny.py:step" and data["program"]["mesh"] == {"data": 4}
    assert [c["kind"] for c in data["collectives"]] == ["all-reduce"]


def test_text_report_with_flags(program: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `--flags --xla_...` (a value that starts with dashes) works as `--flags=...` does
    flag = "--xla_gpu_all_reduce_combine_threshold_bytes=0"
    code, out, _ = run(capsys, f"{program}:step", "--flags", flag)
    assert code == 0
    assert out.startswith("tiny.py:step on 8 x H100 SXM, mesh data=8\n")
    assert "xla_gpu_all_reduce_combine_threshold_bytes=0" in out
    assert "Step, the kit's model:" in out and "Step, XLA's model:" in out and "Findings" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "name a program file"),
        (("missing.py",), "no such file: missing.py"),
        (("{program}:nothing",), "defines no function 'nothing'"),
        (("{program}", "--mesh", "data:8"), "NAME=SIZE"),
        (("{program}", "--flags", "-xla_gpu_foo=1"), "must look like --name=value"),
        (("{program}", "--flags=--xla_gpu_enable_async_all_reduce=true"), "| removed |"),
        (("{program}", "--timeline", "out.png"), "--timeline out.png: name a file ending in"),
    ],
)
def test_usage_errors_exit_2(
    program: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    code, out, err = run(capsys, *(a.format(program=program) for a in args))
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err


def test_program_failures_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "broken.py").write_text("raise RuntimeError('my bug')\n")
    code, _, err = run(capsys, str(tmp_path / "broken.py"))
    assert code == 1 and "importing" in err and "RuntimeError: my bug" in err
    odd = tmp_path / "odd.py"
    odd.write_text(
        PROGRAM.replace("(64, 128), jnp.bfloat16, sharding", "(63, 128), jnp.bfloat16, sharding")
    )
    code, _, err = run(capsys, str(odd))
    assert code == 1 and "did not trace or lower" in err and "divides by its mesh axis" in err
    assert len(err.splitlines()) < 12  # short: no traceback


@pytest.mark.parametrize(
    ("flags", "verdict"),
    [
        ("--xla_gpu_no_such_flag=1", "| --xla_gpu_no_such_flag=1 | unknown |"),
        ("--xla_dump_to", "| --xla_dump_to | bad_value | needs a value: write --xla_dump_to=VALUE"),
        ("--xla_dump_hlo_pass_re", "| --xla_dump_hlo_pass_re | bad_value | needs a value"),
        ("--xla_gpu_all_reduce_combine_threshold_bytes", "needs a value"),
        ("--xla_gpu_enable_async_all_reduce=true", "| --xla_gpu_enable_async_all_reduce=true |"),
    ],
)
def test_flags_the_check_refuses_are_usage_errors_with_its_table(
    program: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    flags: str,
    verdict: str,
) -> None:
    monkeypatch.chdir(tmp_path)  # a dump would land here: `./true/` was one
    code, out, err = run(capsys, str(program), "--flags", flags)
    assert code == 2 and out == "", err
    assert err.startswith("error: --flags: 1 of 1 flags are refused") and verdict in err
    assert "=true: expected" not in err  # nothing the user did not type
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.py"]


def test_timeline_trace_and_picture(
    program: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "step.json"
    code, out, err = run(capsys, str(program), "--json", "--timeline", str(trace))
    report = json.loads(out)  # stdout stays the JSON report
    assert code == 0 and report["program"]["name"] == "tiny.py:step"
    assert err.startswith(f"timeline trace (open it in the Perfetto UI) written to {trace}: ")
    assert "tiny.py:step: " in err and "modelled, not measured" in err
    data = json.loads(trace.read_text())
    jsonschema.validate(data, trace_events.SCHEMA)
    assert trace_events.problems(data) == []
    names = {e["args"]["name"] for e in data["traceEvents"] if e["name"] == "process_name"}
    assert names == {"tiny.py:step", "tiny.py:step, XLA's model"}  # both models, one axis
    assert "XLA's model" in err and "the kit's model" in err
    for pid in (1, 2):
        moves = [e for e in data["traceEvents"] if e.get("cat") in ("transfer", "sync")]
        kinds = [e["args"]["collective"] for e in moves if e["pid"] == pid]
        assert kinds == [c["kind"] for c in report["collectives"]]
    picture = tmp_path / "step.svg"
    code, out, err = run(capsys, str(program), "--timeline", str(picture))
    assert code == 0 and out.startswith("tiny.py:step on 8 x H100 SXM")
    assert picture.read_text().startswith("<svg") and "written to" in err


def test_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--schema")
    assert code == 0 and json.loads(out) == SCHEMA


@pytest.mark.parametrize(
    ("mesh", "message"),
    [
        ("data=4,data=2", "mesh axis 'data' is given twice in 'data=4,data=2'"),
        ("data=4,model=4", "--mesh data=4,model=4: mesh data=4,model=4 needs 16 GPUs; an HGX"),
        ("data=1024", "--mesh data=1024: mesh data=1024 needs 1024 GPUs"),
    ],
)
def test_meshes_one_host_cannot_hold_are_usage_errors(
    program: Path, capsys: pytest.CaptureFixture[str], mesh: str, message: str
) -> None:
    code, out, err = run(capsys, str(program), "--mesh", mesh)
    assert code == 2 and out == "" and message in err, err
    assert "num_hosts=" not in err.split("labkit.xla.aot")[0]  # not an option of the CLI


def test_a_bad_mesh_from_the_file_says_it_came_from_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "colon.py"
    path.write_text(PROGRAM.replace('MESH = "data=8"', 'MESH = "data:8"'))
    code, _, err = run(capsys, str(path))
    assert code == 2 and f"{path} sets MESH = 'data:8', which is not usable: a mesh is" in err


def test_a_program_over_the_hbm_says_so_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "big.py"  # 800 GB of f32 over 8 GPUs: 100 GB each
    path.write_text(PROGRAM.replace("(64, 128), jnp.bfloat16", "(8 * 25 * 10**9, 1), jnp.float32"))
    path.write_text(path.read_text().replace("jnp.tanh(x @ w).sum()", "(x * 2.0).sum()"))
    code, out, err = run(capsys, str(path))
    assert code == 0 and "Step, the kit's model:" in out
    assert err.startswith("big.py:step: does not fit on an H100 SXM (80 GB): needs 100 GB per GPU")
    before, _, xla = err.partition("written to stderr while compiling (XLA's log, warnings):")
    assert "This indicates an error" not in before and "This indicates an error" in xla
    assert run(capsys, str(path), "--check", "--json")[0] == 1


def test_a_host_callback_says_it_cannot_compile_without_a_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "callback.py"
    path.write_text(
        PROGRAM.replace("import jax\n", "import jax\nimport numpy as np\n").replace(
            "return jnp.tanh(x @ w).sum()",
            "y = jax.pure_callback(np.tanh, jax.ShapeDtypeStruct(x.shape, x.dtype), x)\n"
            "    return (y @ w).sum()",
        )
    )
    code, out, err = run(capsys, str(path))
    assert code == 1 and out == ""
    assert "a host callback cannot be compiled for a GPU without one" in err
    assert "Unknown backend" not in err
