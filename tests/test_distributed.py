"""labkit.distributed: real multi-process launches, their failures, and the cluster recipes.

Every launch test also checks that no launched process is left: by pid (``os.kill(pid, 0)``
and the /proc state) and by a /proc scan for children of this process.
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys

import pytest
import yaml

from labkit import distributed as dist
from labkit.lessons.n07_multiprocess import children_running

ECHO = "labkit.lessons.n07_multiprocess:echo"
FAIL = "labkit.lessons.n07_multiprocess:fail"


def launched_children() -> list[int]:
    """Pids of live (non-zombie) children of this process running labkit.distributed."""
    return children_running()


def assert_none_left(pids: list[int]) -> None:
    assert pids, "the launch recorded no pids"
    assert [p for p in pids if dist.alive(p)] == []
    assert launched_children() == []


def test_free_port_is_bindable() -> None:
    port = dist.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_alive() -> None:
    assert dist.alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not dist.alive(child.pid)


def test_launch_gathers_results_and_stops_everything() -> None:
    run = dist.launch(ECHO, {"tag": "x"}, num_processes=2, cpu_devices=2, timeout_s=120)
    assert [r["process_index"] for r in run.results] == [0, 1]
    assert all(r["process_count"] == 2 and r["num_devices"] == 4 for r in run.results)
    assert all(r["tag"] == "x" for r in run.results)
    assert run.results[0]["local_device_ids"] != run.results[1]["local_device_ids"]
    assert [r["pid"] for r in run.results] == run.pids
    assert run.attempts == 1 and all(s > 0 for s in run.startup_s)
    assert len(run.logs) == 2
    assert_none_left(run.pids)


def test_a_raising_process_shows_its_traceback() -> None:
    with pytest.raises(dist.ProcessFailed, match="failed on purpose") as info:
        dist.launch(FAIL, {"process_id": 1}, cpu_devices=1, timeout_s=120, grace_s=0.5)
    err = info.value
    assert err.process_id == 1 and err.returncodes[1] == 1
    assert err.returncodes[0] is None  # still waiting for its peer: killed by the launcher
    assert "Traceback" in str(err) and "ValueError" in str(err)
    assert_none_left(err.pids)


def test_a_hanging_launch_times_out_and_is_killed() -> None:
    with pytest.raises(dist.LaunchTimeout, match="still running after 12 s") as info:
        dist.launch(FAIL, {"process_id": 99}, cpu_devices=1, timeout_s=12)
    assert info.value.returncodes == [None, None]
    assert_none_left(info.value.pids)


def test_a_taken_port_fails_clearly_when_given() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(dist.ProcessFailed, match=r"RPC server|Address already in use") as info:
            dist.launch(ECHO, cpu_devices=1, port=port, timeout_s=120, grace_s=0.5)
    assert info.value.process_id == 0
    assert_none_left(info.value.pids)


def test_a_lost_port_race_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        lost = taken.getsockname()[1]
        ports = iter([lost, dist.free_port()])
        monkeypatch.setattr(dist, "free_port", lambda host="127.0.0.1": next(ports))
        run = dist.launch(ECHO, cpu_devices=1, timeout_s=120, grace_s=0.5)
    assert run.attempts == 2 and run.port != lost
    assert_none_left(run.pids)


def test_a_coordinator_that_never_comes_up() -> None:
    with pytest.raises(dist.ProcessFailed, match=r"DEADLINE_EXCEEDED|RegisterTask") as info:
        dist.launch(ECHO, cpu_devices=1, process_ids=[1], initialization_timeout=2, timeout_s=60)
    assert info.value.returncodes == [-6]  # JAX aborts the process (SIGABRT)
    assert "Check failure stack trace" not in str(info.value)  # the C++ dump is cut
    assert_none_left(info.value.pids)


def test_bad_arguments_fail_before_starting_anything() -> None:
    with pytest.raises(ValueError, match="module:function"):
        dist.launch("no_colon")
    with pytest.raises(ValueError, match="platform"):
        dist.launch(ECHO, platform="tpu")
    with pytest.raises(TypeError):
        dist.launch(ECHO, {"x": object()})


# ---------------------------------------------------------------------------------------
# SLURM


def test_slurm_script_structure() -> None:
    script = dist.slurm_script("python -m train", nodes=4, gpus_per_node=8)
    assert dist.validate_slurm(script) == {"nodes": 4, "tasks_per_node": 8, "processes": 32}
    assert "\nsrun " in script and "--gpus-per-node=8" in script


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("srun --kill-on-bad-exit=1 ", "", "no srun"),
        ("--ntasks-per-node=8", "--ntasks-per-node=1", "one process per GPU"),
        ("#SBATCH --nodes=2\n", "", "missing #SBATCH --nodes"),
    ],
)
def test_slurm_validator_rejects(old: str, new: str, why: str) -> None:
    script = dist.slurm_script("python -m train").replace(old, new)
    with pytest.raises(ValueError, match=why):
        dist.validate_slurm(script)


def test_slurm_detection_reads_the_job() -> None:
    before = dict(os.environ)
    env = {"SLURM_JOB_ID": "100", "SLURM_STEP_NODELIST": "node[003-004],x", "SLURM_NTASKS": "16",
           "SLURM_PROCID": "12", "SLURM_LOCALID": "4"}  # fmt: skip
    found = dist.slurm_detect(env)
    assert found == {"detected": True, "coordinator_address": f"node003:{dist.slurm_port(100)}",
                     "num_processes": 16, "process_id": 12, "local_device_ids": [4]}  # fmt: skip
    assert 61440 <= dist.slurm_port(100) <= 65535
    assert dist.slurm_detect({"SLURM_JOB_ID": "1"}) == {"detected": False}
    assert dict(os.environ) == before


# ---------------------------------------------------------------------------------------
# Kubernetes


def test_k8s_manifest_parses_and_wires_the_coordinator() -> None:
    docs = list(yaml.safe_load_all(dist.to_yaml(dist.k8s_manifest("t", num_processes=4))))
    assert docs == dist.k8s_manifest("t", num_processes=4)  # the YAML says what the dicts say
    service, job = docs
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 4
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"] == "t"
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env == {"JAX_COORDINATOR_ADDRESS": f"t-0.t:{dist.K8S_COORDINATOR_PORT}",
                   "JAX_NUM_PROCESSES": "4"}  # fmt: skip
    assert dist.validate_k8s(docs)["processes"] == 4
    assert "&id" not in dist.to_yaml(docs)  # no YAML anchors: plain to read


def _drop_mode(d: list) -> None:
    del d[1]["spec"]["completionMode"]


def _not_headless(d: list) -> None:
    d[0]["spec"]["clusterIP"] = "10.0.0.1"


def _no_subdomain(d: list) -> None:
    del d[1]["spec"]["template"]["spec"]["subdomain"]


def _wrong_count(d: list) -> None:
    d[1]["spec"]["parallelism"] = 3


@pytest.mark.parametrize(
    ("break_it", "why"),
    [(_drop_mode, "Indexed"), (_not_headless, "headless"), (_no_subdomain, "subdomain"),
     (_wrong_count, "parallelism")],
)  # fmt: skip
def test_k8s_validator_rejects(break_it: object, why: str) -> None:
    docs = copy.deepcopy(dist.k8s_manifest())
    break_it(docs)  # type: ignore[operator]
    with pytest.raises(ValueError, match=why):
        dist.validate_k8s(docs)


def test_init_from_env_passes_the_k8s_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    import jax

    seen: dict = {}
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: seen.update(kw))
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "3")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "j-0.j:55527")
    dist.init_from_env()
    assert seen == {"coordinator_address": "j-0.j:55527", "num_processes": 4, "process_id": 3}


# ---------------------------------------------------------------------------------------
# Two hosts versus one, compiled for H100s


@pytest.mark.aot
def test_two_hosts_compile_the_same_program_as_one() -> None:
    from labkit.gpt.compile import compile_train_step
    from labkit.xla.aot import h100_mesh
    from labkit.xla.compare import identical

    two = compile_train_step("tiny", "dp", mesh=h100_mesh((16,), ("data",), num_hosts=2))
    one = compile_train_step("tiny", "dp", mesh=h100_mesh((16,), ("data",), num_hosts=1))
    assert identical(two.hlo, one.hlo)
