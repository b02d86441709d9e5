"""SLURM for real: labkit.parallel.local_slurm's clusters, the kit's recipes run on them.

As root with Debian's slurm-wlm and munge (``make test`` installs them: ``make slurm-deps``):
``make slurm``'s command brings up a one-node cluster on loopback; a batch job is stored
byte for byte and its ``scancel`` reaches JAX as a preemption notice; two simulated hosts
(network namespaces joined by a veth pair) run a job across two nodes; a watchdog stops a
cluster whose owner was killed. Every test checks that nothing listened on a non-loopback
address of this machine (``ss -ltn``) and that stopping leaves no process, namespace or
file. 07's training as 2 SLURM tasks from its ``srun`` line is tested beside its lesson
(tests/lessons/test_n07_multiprocess.py). The parsing and recipe tests need no cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from listeners import ListenerWatch

from labkit.parallel import cluster, local_slurm, slurm_jobs
from labkit.parallel.distributed import alive

needs_slurm = pytest.mark.skipif(
    local_slurm.can_start() is not None,
    reason=f"no SLURM cluster can start here: {local_slurm.can_start()}",
)


# --- Recipes and parsing (no cluster) ---


def test_script_and_srun_line_share_the_launch_options_and_bind_the_coordinator() -> None:
    command = cluster.task_command("labkit.parallel.distributed:echo", {"steps": 2})
    script = cluster.slurm_script(command, 1, 0, tasks_per_node=2, cpu_devices=4, cpus_per_task=1)
    line = cluster.srun_line(command, ["localhost"], 2, "127.0.0.1", 61001, 4)
    launch = f"srun {cluster.launch_options()} {command}"
    assert launch in script.splitlines()
    assert line.endswith(f"{cluster.launch_options()} {command}")
    assert "--kill-on-bad-exit=1" in cluster.launch_options()
    assert "# --kill-on-bad-exit=1: when one task fails" in script  # says why
    assert "export JAX_COORDINATOR_BIND_ADDRESS=" in script
    assert line.startswith(
        "JAX_COORDINATOR_PORT=61001 JAX_COORDINATOR_BIND_ADDRESS=127.0.0.1:61001"
    )
    assert "--kill-on-bad-exit" not in cluster.srun_line(command, ["a"], 1, "x", 1, 0, False)
    assert cluster.validate_slurm(script) == {"nodes": 1, "tasks_per_node": 2, "processes": 2}


def test_task_results_and_ends_are_read_from_labelled_output() -> None:
    out = "\n".join(
        [
            "0: labkit-task start job=7 node=n1 pid=1 t=1.0",
            '1: labkit-result {"rank": 1, "node": "n2", "job": 7, "value": 3, "listening": []}',
            '0: labkit-result {"rank": 0, "node": "n1", "job": 7, "value": 2, "listening": []}',
            "srun: error: n2: task 1: Killed",
            "srun: error: n1: tasks 0,2-3: Exited with exit code 1",
        ]
    )
    assert [r["value"] for r in cluster.task_results(out).values()] == [2, 3]
    assert slurm_jobs.task_ends(out) == {
        1: "Killed",
        0: "Exited with exit code 1",
        2: "Exited with exit code 1",
        3: "Exited with exit code 1",
    }


def test_step_summary_counts_from_the_tasks_own_clock() -> None:
    lines = [
        (100.0, "1: dying t=99.5"),
        (100.1, "srun: launch/slurm: _step_signal: Terminating StepId=7.0"),
        (102.5, "srun: error: n1: task 0: Killed"),
        (102.6, "srun: error: n2: task 1: Killed"),
    ]
    run = slurm_jobs.StepRun("srun ...", 137, 3.0, lines, 7, None)
    summary = slurm_jobs.step_summary(run)
    assert summary["task 0"] == summary["task 1"] == "Killed"
    assert summary["cancelled_after_s"] == 0.6 and summary["ended_after_s"] == 3.1


def test_the_config_keeps_every_daemon_on_its_own_address(tmp_path: Path) -> None:
    nodes = [local_slurm.Node("node1", "10.77.0.1", 5), local_slurm.Node("node2", "10.77.0.2", 6)]
    socket = Path("/run/labkit-munge-x/munge.socket")
    text = local_slurm._config(tmp_path, nodes, "lab", 2, (6817, 6818), socket)
    assert "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny" in text
    assert "SlurmctldHost=node1(10.77.0.1)" in text and "NodeName=node2 NodeAddr=10.77.0.2" in text
    assert f"AuthInfo=socket={socket}" in text  # its own munged
    assert all(str(tmp_path) in line for line in text.splitlines() if "File=" in line)


def test_without_root_nothing_starts_and_it_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "root" in (local_slurm.can_start() or "")
    with pytest.raises(local_slurm.SlurmError, match="as root"):
        local_slurm.start()
    found, said = local_slurm.for_lesson("auto") if local_slurm.find() is None else (None, "")
    assert found is None and ("root" in said or not said)


# --- A one-node cluster, as `make slurm` starts it ---


@pytest.fixture(scope="module")
def one_node() -> Iterator[tuple[local_slurm.LocalSlurm, ListenerWatch]]:
    """`make slurm`'s command on a temporary folder; `make slurm-stop`'s at the end."""
    folder = Path(tempfile.mkdtemp(prefix="labkit-test-slurm-")) / "slurm"
    cli = [sys.executable, "-m", "labkit.parallel.local_slurm"]
    try:
        with ListenerWatch() as watch:
            t0 = time.perf_counter()
            up = subprocess.run(
                [*cli, "up", "--folder", str(folder)], capture_output=True, text=True
            )
            print(f"make slurm: {time.perf_counter() - t0:.1f} s")
            assert up.returncode == 0, up.stdout + up.stderr
            assert f"export SLURM_CONF={folder}/slurm.conf" in up.stdout
            found = local_slurm.find(folder)
            assert found is not None
            yield found, watch
            down = subprocess.run([*cli, "down", "--folder", str(folder)], capture_output=True)
            assert down.returncode == 0, down.stdout
            assert not folder.exists() and local_slurm.leftovers(folder) == []
    finally:
        subprocess.run([*cli, "down", "--folder", str(folder)], capture_output=True)
        shutil.rmtree(folder.parent, ignore_errors=True)


@needs_slurm
def test_one_node_daemons_listen_on_loopback_only(one_node: tuple) -> None:
    slurm, watch = one_node
    assert slurm.nodes == [local_slurm.Node("localhost", "127.0.0.1")]
    info = slurm.run(["sinfo", "--noheader", "--format=%P %D %t"]).stdout.split()
    assert info == ["lab*", "1", "idle"]
    assert watch.new == set(), f"listening beyond loopback: {watch.new}"


@needs_slurm
def test_a_batch_job_is_stored_byte_for_byte_and_scancel_reaches_jax(one_node: tuple) -> None:
    slurm, watch = one_node
    command = cluster.task_command("labkit.parallel.distributed:until_preempted")
    script = cluster.slurm_script(command, 1, 0, tasks_per_node=2, cpu_devices=1, cpus_per_task=1)
    with tempfile.TemporaryDirectory() as work:
        job = slurm.sbatch(script, Path(work))
        out = Path(work) / f"slurm-{job}.out"
        deadline = time.monotonic() + 120
        while "step 2 " not in (out.read_text() if out.exists() else ""):
            assert time.monotonic() < deadline, out.read_text() if out.exists() else "no output"
            time.sleep(0.2)
        slurm.run(["scancel", str(job)])
        run = slurm_jobs.collect_batch(slurm, job, script, Path(work))
    assert run.stored == script
    stops = [r["value"]["preempted_at"] for r in run.results.values()]
    assert len(stops) == 2 and stops[0] == stops[1] is not None, run.output[-2000:]
    assert run.state == "CANCELLED"
    assert watch.new == set()


# --- Two simulated hosts, and the watchdog ---


@needs_slurm
def test_two_simulated_hosts_run_a_job_across_two_nodes_and_vanish() -> None:
    if problem := local_slurm.namespaces_problem():
        pytest.skip(f"no simulated hosts here: {problem}")
    with ListenerWatch() as watch:
        slurm = local_slurm.start(nodes=2)
        try:
            assert slurm.namespaced and [n.name for n in slurm.nodes] == ["node1", "node2"]
            command = cluster.task_command("labkit.parallel.distributed:echo")
            script = cluster.slurm_script(
                command, 2, 0, tasks_per_node=1, cpu_devices=2, cpus_per_task=1
            )
            with tempfile.TemporaryDirectory() as work:
                run = slurm_jobs.run_batch(slurm, script, Path(work), timeout_s=180)
            assert run.state == "COMPLETED", run.output[-2000:]
            results = run.results
            assert [r["node"] for r in results.values()] == ["node1", "node2"]
            assert all(r["value"]["num_devices"] == 4 for r in results.values())
            addresses = {s[0] for r in results.values() for s in r["listening"]}
            assert addresses == {"10.77.0.1", "10.77.0.2"}  # inside the namespaces only
            holders = [n.holder for n in slurm.nodes]
        finally:
            left = slurm.stop()
    assert left == [] and not slurm.folder.exists()
    assert not any(alive(h) for h in holders if h is not None)  # the namespaces are gone
    assert watch.new == set(), f"listening beyond loopback: {watch.new}"
    assert (
        "10.77.0."
        not in subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True).stdout
    )


@needs_slurm
def test_a_watchdog_stops_the_cluster_when_its_owner_is_killed(tmp_path: Path) -> None:
    owner = (
        "import json, sys, time; from labkit.parallel import local_slurm as ls; "
        "c = ls.start(watch_pid=__import__('os').getpid()); "
        "print(json.dumps({'folder': str(c.folder), 'pids': c.pids}), flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", owner], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    started = json.loads(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)  # as nbval kills a kernel: no atexit, no finally
    proc.wait()
    deadline = time.monotonic() + 30

    def left() -> list[int]:  # the watchdog itself ends a moment after removing the folder
        return [p for p in started["pids"].values() if alive(p)]

    while (Path(started["folder"]).exists() or left()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(started["folder"]).exists()
    assert left() == []


def test_a_stale_state_file_never_stops_a_process_that_is_not_the_clusters(
    tmp_path: Path,
) -> None:
    bystander = subprocess.Popen(["sleep", "60"])  # took a pid an old state file names
    try:
        node = local_slurm.Node("localhost", "127.0.0.1")
        pids = {"slurmctld": bystander.pid, "slurmd localhost": bystander.pid}
        stale = local_slurm.LocalSlurm(tmp_path, [node], pids, owns_folder=False)
        stale.save()
        assert not stale.running()  # alive, but without this cluster's marker
        assert local_slurm.find(tmp_path) is None
        assert stale.stop() == [] and alive(bystander.pid)
    finally:
        bystander.kill()
        bystander.wait()
