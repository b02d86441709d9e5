"""labkit.parallel.distributed: real multi-process launches and their failures.

Every launch test also checks that no launched process is left: by pid (``os.kill(pid, 0)``
and the /proc state) and by a /proc scan for children of this process.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import os
import socket
import subprocess
import sys
import time

import pytest

from labkit.parallel import distributed as dist

ECHO = "labkit.parallel.distributed:echo"
HOLD = "labkit.parallel.distributed:hold"
FAIL = "labkit.parallel.distributed:fail"


def launched_children() -> list[int]:
    """Pids of live (non-zombie) children of this process running labkit.parallel.distributed."""
    return dist.children_running()


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


def test_a_launch_listens_on_loopback_only() -> None:
    """The coordinator and gloo (CPU collectives) ports, seen from outside while they run."""
    seen: set[tuple[str, int]] = set()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(dist.launch, HOLD, {"seconds": 4.0}, cpu_devices=2, timeout_s=120)
        while not running.done():
            seen |= {(a, port) for a, port, _ in dist.listening(dist.children_running())}
            time.sleep(0.05)
        run = running.result()
    assert run.results == [4, 4]  # a sum over 2 processes x 2 devices: the collectives ran
    assert ("127.0.0.1", run.port) in seen  # the coordinator, on process 0
    assert len(seen) >= 3, seen  # and each process's gloo listener
    assert all(ipaddress.ip_address(a).is_loopback for a, _ in seen), seen
    assert_none_left(run.pids)


def test_listening_reads_this_process_sockets() -> None:
    with socket.socket() as s, socket.socket(socket.AF_INET6) as s6:
        s.bind(("127.0.0.1", 0))
        s.listen()
        s6.bind(("::", 0))
        s6.listen()
        found = {(a, p) for a, p, pid in dist.listening([os.getpid()]) if pid == os.getpid()}
        assert ("127.0.0.1", s.getsockname()[1]) in found
        assert ("::", s6.getsockname()[1]) in found  # all interfaces, as JAX's default was


def test_bad_arguments_fail_before_starting_anything() -> None:
    with pytest.raises(ValueError, match="module:function"):
        dist.launch("no_colon")
    with pytest.raises(ValueError, match="platform"):
        dist.launch(ECHO, platform="tpu")
    with pytest.raises(TypeError):
        dist.launch(ECHO, {"x": object()})


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


def test_children_running_finds_a_labkit_child() -> None:
    assert dist.children_running() == []
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "labkit.parallel.distributed"]
    )
    try:
        for _ in range(50):
            if child.pid in dist.children_running():
                break
            time.sleep(0.05)
        assert child.pid in dist.children_running()
    finally:
        child.kill()
        child.wait()
    assert dist.children_running() == []
