"""labkit.core.env: setup before the backend starts, clear errors, the environment report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import pytest

from labkit.core import env

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    environ.update(extra_env)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=120
    )


def test_conftest_setup_gave_eight_cpu_devices() -> None:
    assert env.current() == env.Setup("cpu", 8, ())
    assert len(jax.devices()) == 8
    assert jax.default_backend() == "cpu"


def test_same_setup_after_start_is_harmless() -> None:
    jax.devices()
    assert env.setup(cpu_devices=8, mode="cpu") == env.current()


def test_different_setup_after_start_says_restart() -> None:
    jax.devices()
    with pytest.raises(env.SetupError, match="restart the kernel"):
        env.setup(cpu_devices=4, mode="cpu")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"cpu_devices": 0}, "cpu_devices must be between 1 and 1024, got 0"),
        ({"cpu_devices": 100_000}, "between 1 and 1024, got 100000: each virtual device costs"),
        ({"cpu_devices": 2.5}, "cpu_devices must be a whole number such as 8, got 2.5"),
        ({"mode": "tpu"}, "mode must be"),
        ({"xla_flags": ["xla_dump_to=/tmp"]}, "must look like --name=value"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(env.SetupError, match=match):
        env.setup(**kwargs)  # type: ignore[arg-type]


@pytest.mark.skipif(env.nvidia_gpu_present(), reason="checks the no-GPU message")
def test_gpu_mode_without_gpu_is_a_clear_error() -> None:
    with pytest.raises(env.SetupError, match="no NVIDIA GPU"):
        env.setup(mode="gpu")


def test_platforms_problem() -> None:
    assert "Unset JAX_PLATFORMS" in (env.platforms_problem("cuda", has_gpu=False) or "")
    assert env.platforms_problem("cpu,cuda", has_gpu=True) is None
    assert env.platforms_problem("cpu", has_gpu=False) is None


@pytest.mark.skipif(env.nvidia_gpu_present(), reason="checks the no-GPU message")
def test_jax_platforms_cuda_without_gpu_in_fresh_process() -> None:
    out = _python("from labkit.core import env; env.setup()", JAX_PLATFORMS="cuda")
    assert out.returncode == 1
    assert "JAX_PLATFORMS=cuda but this machine has no NVIDIA GPU" in out.stderr
    assert "jax/_src" not in out.stderr  # our message, not a traceback from inside JAX


def test_fresh_process_gets_devices_and_flags() -> None:
    code = (
        "from labkit.core import env;"
        "env.setup(cpu_devices=3, xla_flags=['--xla_dump_hlo_as_text']);"
        "import jax, os; print(len(jax.devices()), jax.default_backend(), os.environ['XLA_FLAGS'])"
    )
    out = _python(code, XLA_FLAGS="--xla_dump_hlo_as_text=false")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3", "cpu", "--xla_dump_hlo_as_text"]


def test_a_bad_xla_flag_stops_setup_before_jax_starts() -> None:
    code = (
        "from labkit.core import env\n"
        "try:\n    env.setup()\n"
        "except env.SetupError as exc:\n    print(exc)\n"
        "import sys; print('jax started:', 'jax' in sys.modules)"
    )
    out = _python(code, XLA_FLAGS="--xla_gpu_enable_latncy_hiding_scheduler=true")
    assert out.returncode == 0, out.stderr  # no abort: the kernel would live
    assert "XLA_FLAGS would abort JAX at its first operation" in out.stdout
    assert "did you mean --xla_gpu_enable_latency_hiding_scheduler?" in out.stdout
    assert "Fix or unset XLA_FLAGS" in out.stdout and "restart the kernel" in out.stdout
    assert "jax started: False" in out.stdout
    out = _python(code, XLA_FLAGS="--xla_dump_to")  # a string flag needs its value
    assert "| --xla_dump_to | bad_value | needs a value" in out.stdout, out.stderr


def test_accepted_xla_flags_are_checked_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LABKIT_CACHE_DIR", str(tmp_path))
    spawned: list[list[str]] = []
    real = subprocess.run

    def counting(cmd: list[str], *args: Any, **kwargs: Any) -> Any:
        spawned.append(cmd)
        return real(cmd, *args, **kwargs)

    monkeypatch.setattr(env.subprocess, "run", counting)
    assert env.xla_flags_problem("") is None and spawned == []  # unset: no check at all
    flags = "--xla_dump_hlo_as_text --xla_gpu_all_reduce_combine_threshold_bytes=0"
    assert env.xla_flags_problem(flags) is None
    assert len(spawned) == 1 and spawned[0][-3:] == ["flags", "check", flags]
    assert env.xla_flags_problem(flags) is None
    assert len(spawned) == 1  # unchanged flags, same jaxlib: remembered
    assert env.xla_flags_problem("--xla_gpu_enable_async_collectives=true") is not None
    assert len(spawned) == 2
    env.remember_accepted_xla_flags("--xla_dump_hlo_as_text=false")  # as run_with_flags does
    assert env.xla_flags_problem("--xla_dump_hlo_as_text=false") is None
    assert len(spawned) == 2


def test_scratch_dir_goes_when_the_process_ends() -> None:
    code = (
        "import sys\nfrom labkit.core import env\n"
        "path = env.scratch_dir('labkit-test-')\n"
        "(path / 'sub').mkdir(); (path / 'sub' / 'f.txt').write_text('x')\n"
        "print(path, flush=True)\n"
        "if sys.argv[1:] == ['fail']:\n    raise ValueError('a cell failed')\n"
    )
    for how in ("ok", "fail"):
        out = subprocess.run(
            [sys.executable, "-c", code, how], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == (0 if how == "ok" else 1), out.stderr
        path = Path(out.stdout.split()[0])
        assert path.name.startswith("labkit-test-") and not path.exists(), how
        assert not path.parent.exists(), how  # the process's labkit-scratch-<pid> too


def test_a_killed_process_s_scratch_goes_at_the_next_call(tmp_path: Path) -> None:
    import os
    import signal

    code = (
        "import os, sys, time\nfrom labkit.core import env\n"
        "print(env.scratch_dir('labkit-test-'), flush=True)\ntime.sleep(60)\n"
    )
    env_vars = {**os.environ, "TMPDIR": str(tmp_path)}
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env_vars
    )
    path = Path(child.stdout.readline().strip())  # type: ignore[union-attr]
    os.kill(child.pid, signal.SIGKILL)  # as nbval stops a kernel: no exit handler runs
    child.wait()
    assert path.exists()
    assert env.sweep_scratch(tmp_path) == [path.parent] and not path.parent.exists()


def test_merge_flags_later_name_wins() -> None:
    merged = env._merge_xla_flags("--a=1 --b=2", ["--a=3"])
    assert merged == "--a=3 --b=2"


def test_info_and_report_on_cpu() -> None:
    rows = env.info()
    assert rows["backend"] == "cpu" and rows["num_devices"] == 8
    assert rows["gpu_hardware"] is None
    assert rows["h100_compile"] is True  # make setup installs the CUDA plugin and ptxas
    assert "jaxlib" in env.report(rows)


def test_doctor_command() -> None:
    out = _python("import sys; from labkit.cli import main; sys.exit(main(['doctor']))")
    assert out.returncode == 0, out.stderr
    assert "num_devices   8" in out.stdout and "h100_compile  True" in out.stdout
    assert "h100 test compile: ok" in out.stdout


# --------------------------------------------------------------------------------------
# CPU or GPU mode per run, tested without a GPU by injecting the detection.


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A machine with 2 NVIDIA GPUs whose backend has not started yet (setup's view of it)."""
    gpus = ["gpu0", "gpu1"]
    monkeypatch.setattr(env, "nvidia_gpu_present", lambda: True)
    monkeypatch.setattr(env, "backend_started", lambda: False)
    monkeypatch.setattr(env, "gpu_devices", lambda: gpus)
    monkeypatch.setattr(env, "_current", None)
    for name in ("JAX_PLATFORMS", "XLA_FLAGS", "TF_CPP_MIN_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    return gpus


def test_gpu_mode_counts_the_gpus(fake_gpus: list[str]) -> None:
    assert env.setup(mode="gpu") == env.Setup("gpu", 2, ())
    assert env.setup(mode="auto") == env.Setup("gpu", 2, ())
    assert env.current() == env.Setup("gpu", 2, ())


def test_jax_platforms_cpu_picks_cpu_mode_on_a_gpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env, "nvidia_gpu_present", lambda: True)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert env._choose("auto", True, "cpu") == "cpu"
    assert env._choose("auto", True, "") == "gpu"
    assert env._choose("gpu", True, "cpu") == "gpu"  # an explicit mode wins
    # the backend is up with 8 CPU devices: asking again in auto mode is the same setup
    assert env.setup(cpu_devices=8) == env.Setup("cpu", 8, ())


def test_gpu_mode_overrides_jax_platforms_cpu(fake_gpus: list[str]) -> None:
    os.environ["JAX_PLATFORMS"] = "cpu"  # restored by the fixture's monkeypatch
    try:
        assert env.setup(mode="gpu").num_devices == 2
        assert "JAX_PLATFORMS" not in os.environ
    finally:
        jax.config.update("jax_platforms", "cpu")  # this session's backend stays CPU


def test_gpu_mode_without_usable_gpus_says_what_to_do(
    fake_gpus: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(env, "gpu_devices", list)
    with pytest.raises(env.SetupError, match="JAX sees 0 GPUs"):
        env.setup(mode="gpu")

    def broken() -> list[object]:
        raise RuntimeError("Unknown backend: 'gpu' requested, but no platforms are gpu")

    monkeypatch.setattr(env, "gpu_devices", broken)
    with pytest.raises(env.SetupError, match=r"no usable GPU \(Unknown backend.*make setup"):
        env.setup(mode="gpu")


def test_dash_in_a_flag_is_named() -> None:
    with pytest.raises(env.SetupError, match=r"U\+2013.*ASCII hyphens"):
        env._merge_xla_flags("", ["\u2013xla_dump_to=/tmp/d"])


@pytest.mark.gpu
def test_gpu_mode_on_a_real_gpu_counts_jax_devices() -> None:
    code = (
        "from labkit.core import env; s = env.setup(mode='gpu');"
        "import jax; print(s.mode, s.num_devices, len(jax.devices('gpu')))"
    )
    out = _python(code)
    assert out.returncode == 0, out.stderr
    mode, counted, seen = out.stdout.split()
    assert mode == "gpu" and int(counted) == int(seen) > 0


def test_reused_memory_spares_the_page_faults_of_a_fresh_allocation() -> None:
    """A freed 48 MiB block comes back without page faults once freed memory is kept.

    Above 32 MiB (the most glibc's dynamic mmap threshold rises to) every block is fresh
    pages from the kernel: XLA:CPU's temporaries for one run of the small GPT's step are that.
    """
    import subprocess
    import sys

    script = """
import ctypes, resource, sys
from labkit.core.env import reuse_freed_memory
if sys.argv[1] == "keep":
    assert reuse_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def use(size=48 << 20):  # what XLA:CPU does with a run's temporaries: malloc, write, free
    p = libc.malloc(size)
    ctypes.memset(p, 1, size)
    libc.free(p)
use()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    use()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
    counts = {}
    for mode in ("keep", "default"):
        run = subprocess.run(
            [sys.executable, "-c", script, mode], capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 0, run.stderr
        counts[mode] = int(run.stdout.split()[-1])
    # 5 x 48 MiB of fresh 4 KiB pages is about 61,000 faults; reused heap memory needs none
    assert counts["default"] > 30_000 > 1_000 > counts["keep"], counts


def test_ptxas_is_found_in_cuda_13_s_layout_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.machinery
    import importlib.util

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ptxas").write_text("")
    real = importlib.util.find_spec

    def find(name: str, *args: object) -> object:
        if name == "nvidia.cuda_nvcc":
            return None  # no CUDA 12 wheel
        if name == "nvidia.cu13":  # CUDA 13's nvidia-cuda-nvcc puts ptxas in nvidia/cu13/bin
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [str(tmp_path)]
            return spec
        return real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find)
    assert env.find_cuda_dir() == tmp_path


# --------------------------------------------------------------------------------------
# Versions: the calibrated ones, a CUDA plugin jaxlib refuses, what a learner's own
# environment is told. Real environments with other versions: tests/test_own_env.py.

CAL = env.CALIBRATED
SAME = {"jax": CAL, "jaxlib": CAL, "jax-cuda12-plugin": CAL, "jax-cuda12-pjrt": CAL}
OLD = dict.fromkeys(SAME, "0.11.2")


def test_the_calibrated_stack_has_no_problem_and_no_difference() -> None:
    assert env.installed_versions()["jaxlib"] == CAL  # make setup installs it
    assert env.version_problems(SAME) == [] and env.version_difference(SAME) is None
    no_plugin = {**SAME, "jax-cuda12-plugin": None, "jax-cuda12-pjrt": None}
    assert env.version_problems(no_plugin) == [] and env.version_difference(no_plugin) is None


def test_a_plugin_of_another_version_than_jaxlib_is_a_problem_with_its_fix() -> None:
    (problem,) = env.version_problems(
        {**SAME, "jax-cuda12-plugin": "0.11.2", "jax-cuda12-pjrt": "0.11.2"}
    )
    assert problem.startswith(
        f"jax-cuda12-plugin 0.11.2, jax-cuda12-pjrt 0.11.2 do not match jaxlib {CAL}"
    )
    assert f'pip install "jax-cuda12-plugin=={CAL}" "jax-cuda12-pjrt=={CAL}"' in problem
    # compared as jaxlib compares them: the leading numbers, so 0.12.0 is not 0.12.0.1
    assert env.version_problems({**SAME, "jax-cuda12-pjrt": "0.12.0"})
    assert not env.version_problems({**SAME, "jax-cuda12-pjrt": f"{CAL}.dev20261101"})


def test_an_older_jax_with_its_own_plugin_is_a_difference_not_a_problem() -> None:
    assert env.version_problems(OLD) == []
    assert env.version_difference(OLD) == (
        f"the lessons' claims are calibrated to jax and jaxlib {CAL}; here: jax 0.11.2, "
        "jaxlib 0.11.2, jax-cuda12-plugin 0.11.2, jax-cuda12-pjrt 0.11.2"
    )


def test_without_the_plugin_h100_compiles_are_said_unavailable_not_a_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # without the aot extra there is no jax_plugins package at all, and find_spec of a module
    # inside a missing package raises ModuleNotFoundError instead of returning None
    monkeypatch.setattr(env, "_CUDA_PLUGINS", ("labkit_no_such_package.xla_cuda12",))
    problem = env.h100_compile_problem()
    assert problem is not None and "the CUDA PJRT plugin is not installed" in problem
    assert "`aot` extra" in problem and 'pip install -c constraints.txt -e ".[aot]"' in problem
    assert env.info()["h100_compile"] is False


def test_a_plugin_jaxlib_refuses_stops_h100_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    from labkit.xla import aot

    mixed = {**SAME, "jax-cuda12-plugin": "0.11.2", "jax-cuda12-pjrt": "0.11.2"}
    monkeypatch.setattr(env, "installed_versions", lambda: mixed)
    with pytest.raises(aot.AotUnavailable, match="do not match jaxlib"):
        aot.check_available()


def test_a_kernel_that_imported_another_jax_is_told_to_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert env.stale_import_problem() is None
    monkeypatch.setitem(sys.modules, "jax", type(sys)("jax"))
    sys.modules["jax"].__version__ = "0.11.2"  # type: ignore[attr-defined]
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-test")
    problem = env.stale_import_problem()
    assert problem is not None and f"imported jax 0.11.2, but jax {CAL} is installed" in problem
    assert "Runtime > Restart session" in problem


@pytest.mark.parametrize(
    ("variables", "where"),
    [
        ({}, None),
        ({"COLAB_RELEASE_TAG": "x"}, "Colab"),
        ({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, "Kaggle"),
    ],
)
def test_hosted_notebooks_are_recognised(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], where: str | None
) -> None:
    for name in ("COLAB_RELEASE_TAG", "KAGGLE_KERNEL_RUN_TYPE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert env.hosted_notebook() == where


def test_the_install_line_pins_the_source_this_copy_came_from() -> None:
    git = (
        '{"url": "https://example.org/kit.git", "vcs_info": {"vcs": "git", "commit_id": "0a1b2c"}}'
    )
    assert env.source_from_direct_url(git) == ("git", "https://example.org/kit.git@0a1b2c")
    folder = '{"url": "file:///srv/kit", "dir_info": {}}'
    assert env.source_from_direct_url(folder) == ("folder", "/srv/kit")
    archive = '{"url": "https://example.org/kit-0.1.0.tar.gz", "archive_info": {}}'
    assert env.source_from_direct_url(archive)[0] == "url"
    # this checkout: installed editable (make setup) or imported from its folder
    assert env.install_command() == f'pip install -c {ROOT}/constraints.txt -e "{ROOT}[lessons]"'


def test_on_colab_a_mismatch_is_told_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env, "installed_versions", lambda: OLD)
    monkeypatch.setattr(env, "kit_source", lambda: ("git", "https://example.org/kit.git@0a1b2c"))
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    here = env.environment_notes()
    assert len(here) == 1 and "some claims may fail, and a failed claim says so" in here[0]
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-test")
    hosted = env.environment_notes()
    assert hosted[:1] == here and hosted[1].startswith("On Colab: install the kit")
    assert '%pip install "labkit[lessons] @ git+https://example.org/kit.git@0a1b2c"' in hosted[1]


def test_setup_says_a_version_difference_once_on_stderr(
    fake_gpus: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(env, "installed_versions", lambda: OLD)
    monkeypatch.setattr(env, "_notes_said", False)
    env.setup(mode="gpu")
    first = capsys.readouterr()
    assert first.out == "" and first.err.startswith("labkit: the lessons' claims are calibrated")
    env.setup(mode="gpu")  # the first cell run again: said once per process
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(env, "_notes_said", False)
    env.setup(mode="gpu", notes=False)  # labkit doctor says it in its own words
    assert capsys.readouterr().err == ""
