"""labkit.lessons.n07_multiprocess: analyses, the /proc scan and the checkers."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pytest
from listeners import ListenerWatch

from labkit.lessons import n07_multiprocess as n07
from labkit.parallel import cluster, local_slurm, slurm_jobs
from labkit.parallel.distributed import free_port

DEVICES = [{"id": i, "process_index": 0} for i in range(4)] + [
    {"id": 2048 + i, "process_index": 1} for i in range(4)
]


@dataclasses.dataclass
class FakeCollective:
    name: str
    kind: str
    bytes: int
    replica_groups: list[list[int]] | None


@dataclasses.dataclass
class FakeFailure:
    logs: list[str]
    returncodes: list[int | None]
    exit_times: list[float | None]


@pytest.fixture(scope="module")
def mesh_2d():
    from labkit.xla.aot import h100_mesh

    return h100_mesh((2, 8), ("data", "model"), num_hosts=2)


def test_matmul_inputs_are_seeded() -> None:
    x, w = n07.matmul_inputs(16, seed=3)
    x2, w2 = n07.matmul_inputs(16, seed=3)
    assert x.shape == (16, n07.K) and w.shape == (n07.K, n07.N)
    assert (x == x2).all() and (w == w2).all()


def test_host_of_and_crossing_table() -> None:
    assert n07.host_of([0, 7, 8, 15], 8) == [0, 0, 1, 1]
    collectives = [
        FakeCollective("ar", "all-reduce", 100, [list(range(16))]),
        FakeCollective("tp", "all-reduce", 10, [list(range(8)), list(range(8, 16))]),
        FakeCollective("cp", "collective-permute", 5, None),
    ]
    rows = n07.crossing_table(collectives, gpus_per_host=8)
    assert [r["crosses_hosts"] for r in rows] == [True, False, False]
    assert [r["group_size"] for r in rows] == [16, 8, 0]
    assert [r["hosts_per_group"] for r in rows] == [2, 1, 0]


def test_fault_timeline() -> None:
    survivor = (
        "step 0 sum=8 t=100.0\nstep 1 sum=8 t=101.0\nF1123 12:00:00.0 77 client.h:86] Terminating\n"
    )
    victim = "step 0 sum=8 t=100.0\ndying t=100.5\n"
    rows = n07.fault_timeline(FakeFailure([survivor, victim], [-6, -9], [104.0, 100.6]), victim=1)
    assert rows[0]["role"] == "survivor" and rows[1]["role"] == "killed"
    assert rows[0]["steps_after_death"] == 1 and rows[0]["exit_after_death_s"] == 3.5
    assert rows[0]["last_error"].startswith("client.h:86] Terminating")
    assert rows[0]["python_error"] == "" and rows[0]["raised_after_death_s"] is None
    assert rows[1]["exit_code"] == -9 and rows[1]["last_error"] == ""


def test_fault_timeline_reads_a_python_error() -> None:
    victim = "step 0 sum=8 t=100.0\ndying t=100.25\n"
    survivor = (
        "step 0 sum=8 t=100.0\n"
        "raised t=100.375 JaxRuntimeError: UNKNOWN: Gloo all-reduce failed: ... reset by peer\n"
        "E1125 18:25:10.8 15084 agent.cc:288] Polled an error\n"
    )
    rows = n07.fault_timeline(FakeFailure([victim, survivor], [-9, -6], [100.3, 100.75]), victim=0)
    assert rows[1]["python_error"] == "JaxRuntimeError"
    assert rows[1]["raised_after_death_s"] == 0.12  # 0.125 rounded to 2 places
    assert rows[1]["exit_after_death_s"] == 0.5 and rows[1]["steps_after_death"] == 0
    assert rows[0]["role"] == "killed" and rows[0]["python_error"] == ""


def test_heartbeat_window() -> None:
    """Last heartbeat up to timeout/2 before the death; checks once a second."""
    assert n07.heartbeat_window(3) == (1.5, 4.0)
    assert n07.heartbeat_window(100) == (50.0, 101.0)


def test_axis_group(mesh_2d) -> None:
    assert n07.axis_group(mesh_2d, 9, "model") == list(range(8, 16))
    assert n07.axis_group(mesh_2d, 9, "data") == [1, 9]
    with pytest.raises(ValueError, match="not in this mesh"):
        n07.axis_group(mesh_2d, 99, "model")


def test_host_of_matches_the_compile_only_mesh() -> None:
    """Mesh position i of 2 hosts x 8 H100s sits on host i // 8, as crossing_table assumes."""
    from labkit.xla.aot import h100_mesh

    mesh16 = h100_mesh((16,), ("data",), num_hosts=2)
    hosts = [d.process_index for d in mesh16.devices.flat]
    assert hosts == n07.host_of(range(16), 8) == [0] * 8 + [1] * 8


def test_check_device_owner() -> None:
    assert n07.check_device_owner(1, DEVICES, 2049).passed
    wrong = n07.check_device_owner(0, DEVICES, 2049)
    assert not wrong.passed and wrong.attempted
    assert not n07.check_device_owner(..., DEVICES, 2049).attempted
    assert not n07.check_device_owner("one", DEVICES, 2049).passed


def test_device_owner_in_a_launch_not_run() -> None:
    """07.1 asks about 3 processes x 2 devices, numbered as section 1's launch (DEVICES):
    process p's ids start at p x 2048; an id past a process's devices is nobody's."""
    three = {"num_processes": 3, "devices_per_process": 2}
    assert n07.device_owner(DEVICES, 4097, **three) == 2
    assert [n07.device_owner(DEVICES, i, **three) for i in (0, 1, 2048, 2049)] == [0, 0, 1, 1]
    assert n07.device_owner(DEVICES, 4098, **three) == -1  # process 2 has ids 4096, 4097
    assert n07.device_owner(DEVICES, 6144, **three) == -1  # there is no process 3
    assert n07.check_device_owner(2, DEVICES, 4097, **three).passed
    assert not n07.check_device_owner(1, DEVICES, 4097, **three).passed
    with pytest.raises(ValueError, match="processes 0 and 1"):
        n07.device_owner(DEVICES[:4], 4097, **three)


def test_check_psum() -> None:
    assert n07.check_psum(6, 3, 2).passed
    assert n07.check_psum(4.0, 2, 4).passed
    wrong = n07.check_psum(3, 3, 2)
    assert not wrong.passed and wrong.attempted
    assert not n07.check_psum(None, 3, 2).attempted


def test_check_model_group(mesh_2d) -> None:
    assert n07.check_model_group(list(range(8, 16)), mesh_2d, 9).passed
    assert "host [1]" in n07.check_model_group(list(range(15, 7, -1)), mesh_2d, 9).message
    for wrong in ([1, 9], list(range(8)), "x", 5):
        feedback = n07.check_model_group(wrong, mesh_2d, 9)
        assert not feedback.passed and feedback.attempted
    assert not n07.check_model_group(..., mesh_2d, 9).attempted


@pytest.mark.skipif(
    local_slurm.can_start() is not None,
    reason=f"no SLURM cluster can start here: {local_slurm.can_start()}",
)
def test_the_training_runs_as_two_slurm_tasks_from_the_srun_line_07_prints() -> None:
    """07's GPT training under ``srun`` on `make slurm`'s kind of cluster (one node on
    loopback): the line runs as printed, both tasks hold one loss, and it learns (07 checks
    the same losses against one process's, bit for bit through section 2's launch)."""
    with ListenerWatch() as watch:
        slurm = local_slurm.start(nodes=1)
        try:
            port = free_port()
            train = cluster.task_command(f"{n07.__name__}:train_worker", {"steps": 3})
            line = cluster.srun_line(train, ["localhost"], 2, "127.0.0.1", port, 4)
            print(line)  # the recipe, as 07 prints it
            with tempfile.TemporaryDirectory() as work:
                step = slurm_jobs.run_step(slurm, line, Path(work), timeout_s=240)
        finally:
            assert slurm.stop() == []
    assert step.line == line and step.returncode == 0, step.output[-3000:]
    results = step.results
    assert sorted(results) == [0, 1] and {r["node"] for r in results.values()} == {"localhost"}
    losses = [r["value"]["losses"] for r in results.values()]
    assert losses[0] == losses[1] and losses[0][-1] < losses[0][0]
    sockets = [tuple(s[:2]) for r in results.values() for s in r["listening"]]
    assert ("127.0.0.1", port) in sockets  # the coordinator, bound where the line says
    assert {a for a, _ in sockets} == {"127.0.0.1"}
    assert watch.new == set(), f"listening beyond loopback: {watch.new}"


def test_network_slowdown_prediction() -> None:
    assert n07.check_network_slowdown(9).passed  # 450 GB/s one way against 50 GB/s
    assert not n07.check_network_slowdown(18).passed  # 900 GB/s counts both directions
    assert n07.check_network_slowdown(4.5, port_gbps=100).passed


def test_global_sum_checker_runs_the_function() -> None:
    import jax
    from jax import P

    from labkit.core.mesh import make_mesh

    mesh = make_mesh((8,), ("x",))

    def with_psum(x):
        return jax.shard_map(
            lambda b: jax.lax.psum(b.sum(), "x"), mesh=mesh, in_specs=P("x"), out_specs=P()
        )(x)

    assert n07.check_global_sum(with_psum).passed
    wrong = n07.check_global_sum(lambda x: x.sum())  # right sum, but no collective asked for
    assert not wrong.passed and wrong.attempted
    assert "raised" in n07.check_global_sum(lambda x: x.nope).message
    assert "expected a function" in n07.check_global_sum(3).message
