"""07_multiprocess: the functions each launched process runs, the analyses, the checkers.

Functions named ``*_worker`` run *inside* the processes that
:func:`labkit.parallel.distributed.launch` starts (after ``jax.distributed.initialize``) and return
JSON. The rest runs in the notebook: single-process references, fault-log parsing, the
2-host H100 program's collectives mapped to hosts, and the exercise checkers.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from labkit.core.feedback import Feedback, check_integer, check_number, judge, unanswered

if TYPE_CHECKING:
    from jax.sharding import Mesh

    from labkit.gpt.config import GPTConfig
    from labkit.parallel.distributed import ProcessFailed
    from labkit.xla.hlo import Collective

K, N = 32, 8  # the sharded matmul: x (rows, K) @ w (K, N), 2 rows per device


def matmul_inputs(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The global ``x`` (rows, K) and ``w`` (K, N), the same in every process (one seed)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, K)).astype(np.float32)
    return x, rng.normal(size=(K, N)).astype(np.float32)


# ---------------------------------------------------------------------------------------
# Run inside the launched processes


class DeviceEntry(TypedDict):
    """A device of the global mesh: its global id and the process that owns it."""

    id: int
    process_index: int


class GlobalMeshResult(TypedDict):
    """What :func:`global_mesh_worker` returns from each process."""

    process_index: int
    devices: list[DeviceEntry]
    local_ids: list[int]
    x_shape: list[int]
    local_x_shape: list[int]
    psum_of_process_index: float
    matmul_max_abs_err: float
    allgather_shape: list[int]


class TrainResult(TypedDict):
    """What :func:`train_worker` returns from each process."""

    losses: list[float]
    first_step_s: float
    seconds: float


class FaultResult(TypedDict):
    """What :func:`fault_worker` returns from a process that lived to return."""

    steps: int
    raised: str | None  # the exception's type name, or None when every step ran


def global_mesh_worker(seed: int = 0) -> GlobalMeshResult:
    """Devices, a psum, a sharded matmul and an allgather over all processes' devices."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec

    from labkit.core.mesh import make_mesh

    me, n = jax.process_index(), jax.process_count()
    mesh = make_mesh((len(jax.devices()),), ("data",))  # every process's devices, in order
    rows = NamedSharding(mesh, PartitionSpec("data"))
    x, w = matmul_inputs(2 * len(jax.devices()), seed)
    per = len(x) // n
    local_x = x[me * per : (me + 1) * per]  # (rows / n, K): only this process's rows
    gx = jax.make_array_from_process_local_data(rows, local_x)  # global (rows, K)
    gw = jax.device_put(w, NamedSharding(mesh, PartitionSpec()))  # replicated (K, N)
    y = jax.jit(jnp.matmul, out_shardings=rows)(gx, gw)  # (rows, N), rows sharded

    def ones_sum(v: jax.Array) -> jax.Array:
        return jax.lax.psum(v, "data")

    ranks = jax.make_array_from_process_local_data(
        rows, np.full((len(jax.local_devices()),), float(me), np.float32)
    )  # (num_devices,): each device holds its process index
    total = jax.shard_map(
        ones_sum, mesh=mesh, in_specs=PartitionSpec("data"), out_specs=PartitionSpec()
    )(ranks)
    full = multihost_utils.process_allgather(y, tiled=True)  # (rows, N) numpy in every process
    return {
        "process_index": me,
        "devices": [{"id": d.id, "process_index": d.process_index} for d in jax.devices()],
        "local_ids": [d.id for d in jax.local_devices()],
        "x_shape": list(gx.shape),
        "local_x_shape": list(local_x.shape),
        "psum_of_process_index": float(total.addressable_data(0)[0]),
        "matmul_max_abs_err": float(np.abs(full - x @ w).max()),
        "allgather_shape": list(full.shape),
    }


def _gpt_batches(cfg: GPTConfig, steps: int, batch_size: int) -> list[np.ndarray]:
    from labkit.gpt import data

    tokens = data.encode(data.corpus(200_000))
    return [data.batch_at(tokens, s, batch_size, cfg.seq_len) for s in range(steps)]


def train_worker(steps: int = 4, batch_size: int = 16, preset: str = "tiny") -> TrainResult:
    """The GPT trained data-parallel over every process's devices; losses and timings."""
    import jax

    from labkit.core.mesh import make_mesh
    from labkit.gpt import train
    from labkit.gpt.config import GPTConfig

    t0 = time.perf_counter()
    cfg = GPTConfig.preset(preset)
    mesh = make_mesh((len(jax.devices()),), ("data",))
    step, abstract, batch_abs = train.train_setup(cfg, mesh, "dp", batch_size)
    state = train.init_train_state(cfg, abstract)
    me, per = jax.process_index(), batch_size // jax.process_count()
    losses, compile_s = [], 0.0
    for k, tokens in enumerate(_gpt_batches(cfg, steps, batch_size)):
        local = tokens[me * per : (me + 1) * per]  # (batch / processes, seq + 1): my rows only
        batch = jax.make_array_from_process_local_data(batch_abs.sharding, local)
        state, loss = step(state, batch)
        losses.append(float(loss.addressable_data(0)))
        compile_s = time.perf_counter() - t0 if k == 0 else compile_s
    return {"losses": losses, "first_step_s": compile_s, "seconds": time.perf_counter() - t0}


def single_process_losses(
    steps: int = 4, batch_size: int = 16, preset: str = "tiny"
) -> list[float]:
    """The same training on this process's own devices: the reference for the launch."""
    import jax

    from labkit.core.mesh import make_mesh
    from labkit.gpt import train
    from labkit.gpt.config import GPTConfig

    cfg = GPTConfig.preset(preset)
    mesh = make_mesh((len(jax.devices()),), ("data",))
    step, abstract, batch_abs = train.train_setup(cfg, mesh, "dp", batch_size)
    state = train.init_train_state(cfg, abstract)
    losses = []
    for tokens in _gpt_batches(cfg, steps, batch_size):
        state, loss = step(state, jax.device_put(tokens, batch_abs.sharding))
        losses.append(float(loss))
    return losses


def fault_worker(
    steps: int = 40, victim: int = 1, die_at: int = 5, carry_on_s: float = 10.0
) -> FaultResult:
    """All-reduce once per step; process ``victim`` kills itself (SIGKILL) at step ``die_at``.

    Every process prints ``step k sum=... t=<unix time>`` lines, the victim ``dying t=...``.
    A survivor whose all-reduce raises prints ``raised t=... Type: message`` and then carries
    on without collectives for ``carry_on_s`` seconds, as a program that caught the error
    would: the parent reads from the logs whether Python saw an error, and whether JAX ended
    the process anyway.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from labkit.core.mesh import make_mesh

    mesh = make_mesh((len(jax.devices()),), ("data",))
    ones = jax.make_array_from_process_local_data(
        NamedSharding(mesh, PartitionSpec("data")), np.ones(len(jax.local_devices()), np.float32)
    )
    total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, PartitionSpec()))
    for k in range(steps):
        if jax.process_index() == victim and k == die_at:
            print(f"dying t={time.time():.3f}", flush=True)
            os.kill(os.getpid(), 9)
        try:
            value = float(total(ones).addressable_data(0))  # an all-reduce across processes
        except Exception as exc:  # what a training loop could catch; JAX may end us anyway
            print(f"raised t={time.time():.3f} {type(exc).__name__}: {exc}", flush=True)
            time.sleep(carry_on_s)
            return {"steps": k, "raised": type(exc).__name__}
        print(f"step {k} sum={value:g} t={time.time():.3f}", flush=True)
        time.sleep(0.2)
    return {"steps": steps, "raised": None}


# ---------------------------------------------------------------------------------------
# Analyses in the notebook

# How JAX's coordination service notices a dead process (XLA source, openxla/xla
# xla/pjrt/distributed/coordination/: coordination_service_agent.cc sends a heartbeat every
# heartbeat_timeout / 2; coordination_service.cc checks once a second and declares a task
# dead when its last heartbeat is older than heartbeat_timeout).
HEARTBEAT_CHECK_S = 1.0  # the service's staleness check period


def heartbeat_window(heartbeat_s: float) -> tuple[float, float]:
    """``(earliest, latest)`` seconds after a death at which the service can declare it.

    The dead process's last heartbeat was at most ``heartbeat_s / 2`` before it died, so
    the timeout cannot fire sooner than ``heartbeat_s / 2`` after the death; it fires at the
    first check after ``heartbeat_s`` without a heartbeat, at most ``heartbeat_s`` plus one
    check period after it.
    """
    return heartbeat_s / 2, heartbeat_s + HEARTBEAT_CHECK_S


def fault_timeline(error: ProcessFailed, victim: int) -> list[dict[str, str | int | float | None]]:
    """Per process of a failed fault run: exit code, steps after the death, the Python error
    a survivor saw (if any), and seconds from the death to that error and to its exit.

    ``error`` is the :class:`labkit.parallel.distributed.ProcessFailed` the launch raised; the
    victim's log holds its ``dying t=`` line, the others' logs their steps, ``raised t=`` line
    and last error line.
    """
    died = float(re.findall(r"dying t=([\d.]+)", error.logs[victim])[0])
    rows: list[dict[str, str | int | float | None]] = []
    runs = zip(error.logs, error.returncodes, error.exit_times, strict=True)
    for i, (log, code, exited) in enumerate(runs):
        steps = [float(t) for t in re.findall(r"step \d+ sum=\S+ t=([\d.]+)", log)]
        raised = re.findall(r"^raised t=([\d.]+) (\w+): ", log, re.MULTILINE)
        said = [ln for ln in log.splitlines() if re.match(r"[EF]\d{4} ", ln)]
        rows.append(
            {
                "process": i,
                "role": "killed" if i == victim else "survivor",
                "exit_code": code,
                "steps_done": len(steps),
                "steps_after_death": sum(t > died for t in steps),
                "python_error": raised[0][1] if raised else "",
                "raised_after_death_s": round(float(raised[0][0]) - died, 2) if raised else None,
                "exit_after_death_s": None if exited is None else round(exited - died, 1),
                "last_error": re.sub(r"^\S+ \S+\s+\d+ ", "", said[-1])[:90] if said else "",
            }
        )
    return rows


def host_of(device_ids: Sequence[int], gpus_per_host: int) -> list[int]:
    """Host (process) index of each compile-only GPU id: ids are numbered host by host."""
    return [d // gpus_per_host for d in device_ids]


def crossing_table(
    collectives: Sequence[Collective], gpus_per_host: int
) -> list[dict[str, str | int | bool]]:
    """Per collective: kind, bytes, group size and whether its groups span several hosts."""
    rows: list[dict[str, str | int | bool]] = []
    for c in collectives:
        groups = c.replica_groups or []
        hosts = [sorted(set(host_of(g, gpus_per_host))) for g in groups]
        rows.append(
            {
                "collective": c.name,
                "kind": c.kind,
                "bytes": c.bytes,
                "groups": len(groups),
                "group_size": len(groups[0]) if groups else 0,
                "hosts_per_group": max((len(h) for h in hosts), default=0),
                "crosses_hosts": any(len(h) > 1 for h in hosts),
            }
        )
    return rows


# ---------------------------------------------------------------------------------------
# Exercise checkers


def device_owner(
    devices: Sequence[Mapping[str, int]],
    device_id: int,
    num_processes: int | None = None,
    devices_per_process: int | None = None,
) -> int:
    """The process that owns global device ``device_id``; -1 if none does.

    Without ``num_processes``, looked up in ``devices`` (a launch's device list). With it, in
    a launch of ``num_processes`` x ``devices_per_process`` CPU devices that numbers them as
    ``devices``' launch did: process p's ids start at p times the offset between its first
    two processes' first ids (2048 in this jaxlib)."""
    if num_processes is None:
        return {d["id"]: d["process_index"] for d in devices}.get(device_id, -1)
    firsts: dict[int, int] = {}
    for d in devices:
        firsts[d["process_index"]] = min(d["id"], firsts.get(d["process_index"], d["id"]))
    if sorted(firsts)[:2] != [0, 1] or firsts[0] != 0:
        raise ValueError("the device list needs processes 0 and 1, process 0's ids from 0")
    owner, local = divmod(device_id, firsts[1])
    per = devices_per_process if devices_per_process is not None else firsts[1]
    return owner if 0 <= owner < num_processes and local < per else -1


def check_device_owner(
    answer: object,
    devices: Sequence[Mapping[str, int]],
    device_id: int,
    num_processes: int | None = None,
    devices_per_process: int | None = None,
) -> Feedback:
    """07.1: which process owns global device ``device_id``: in the launch whose device list
    is ``devices``, or in one of ``num_processes`` x ``devices_per_process`` numbered alike
    (:func:`device_owner`)."""
    owner = device_owner(devices, device_id, num_processes, devices_per_process)
    return check_integer(
        "07.1",
        answer,
        owner,
        f"device {device_id} lives in process {owner}.",
        "each process numbers its devices from its own offset (section 1's table: where does "
        "process 1 start?); which process's range holds this id?",
    )


def check_psum(answer: object, num_processes: int, devices_per_process: int) -> Feedback:
    """07.2: psum over all devices of each device's process index."""
    expected = devices_per_process * sum(range(num_processes))
    return check_number(
        "07.2",
        answer,
        expected,
        1e-9,
        "every device contributes its process index: devices per process x (0 + 1 + ...)",
    )


def axis_group(mesh: Mesh, device_id: int, axis: str) -> list[int]:
    """Ids of the devices that share every mesh coordinate with ``device_id`` except ``axis``."""
    ids = np.vectorize(lambda d: d.id)(mesh.devices)  # mesh-shaped array of device ids
    where = [int(w[0]) for w in np.nonzero(ids == device_id) if len(w)]
    if not where:
        raise ValueError(f"device {device_id} is not in this mesh (ids {ids.ravel().tolist()})")
    k = mesh.axis_names.index(axis)
    index = tuple(slice(None) if j == k else w for j, w in enumerate(where))
    return sorted(int(i) for i in ids[index].ravel())


def check_model_group(answer: object, mesh: Mesh, device_id: int = 9) -> Feedback:
    """07.3: the ``"model"``-axis group of ``device_id`` in a (data, model) mesh over 2 hosts."""
    if unanswered(answer):
        return judge("07.3", answer, False, "", "")
    expected = axis_group(mesh, device_id, "model")
    try:
        if not isinstance(answer, Iterable):
            raise TypeError(f"{type(answer).__name__!r} object is not iterable")
        given = sorted(int(a) for a in answer)
    except (TypeError, ValueError):
        return Feedback("07.3", False, True, "give a list of device ids, e.g. [0, 1]")
    hosts = sorted({d.process_index for d in mesh.devices.flat if d.id in expected})
    return judge(
        "07.3",
        answer,
        given == expected,
        f"{expected}: all on host {hosts}, so tensor-parallel collectives stay on NVLink.",
        "take the mesh row (the 'data' coordinate) that holds the device: the 'model' axis "
        "runs along it; mesh.devices is the array to read",
    )


def check_network_slowdown(answer: object, port_gbps: float = 400 / 8) -> Feedback:
    """07.p1 (predict): how many times longer the same bytes take over one network port of
    ``port_gbps`` GB/s than over an H100's NVLink in one direction."""
    from labkit.core.hardware import hardware

    nvlink = (hardware("H100 SXM").nvlink_gbps or 0.0) / 2  # one direction
    expected = nvlink / port_gbps
    return check_number(
        "07.p1",
        answer,
        expected,
        0.05,
        f"{expected:g}x: {nvlink:g} GB/s one way against {port_gbps:g} GB/s. Bits and bytes?",
    )


def check_global_sum(answer: object, num_devices: int = 8) -> Feedback:
    """07.4: ``answer(x)`` sums a 1-D array split over the devices with ``jax.shard_map``
    and one all-reduce (a ``psum``); run on this process's devices against numpy."""
    if unanswered(answer):
        return judge("07.4", answer, False, "", "")
    if not callable(answer):
        return Feedback("07.4", False, True, f"expected a function of x, got {answer!r}")
    import jax

    from labkit.xla import hlo

    x = np.arange(num_devices * 4, dtype=np.float32)  # (devices x 4,)
    try:
        step = jax.jit(answer)
        got = float(np.asarray(step(x)).reshape(-1)[0])
        counts = hlo.collective_counts(str(step.lower(x).compile().as_text()))
    except Exception as exc:  # the learner's code: show what JAX said
        return Feedback("07.4", False, True, f"it raised {type(exc).__name__}: {exc}"[:300])
    return judge(
        "07.4",
        answer,
        got == float(x.sum()) and counts == {"all-reduce": 1},
        f"the sum {got:g}, with one all-reduce.",
        f"it gives {got:g} (numpy: {x.sum():g}) with collectives {counts}: each device sums "
        "its block, then one jax.lax.psum over the mesh axis",
    )
