"""One process per device group on this machine, with JAX's own multi-controller runtime.

:func:`launch` starts N local processes on 127.0.0.1, each with M CPU devices (or one GPU),
calls ``jax.distributed.initialize(coordinator_address=, num_processes=, process_id=)`` in
each, runs an importable ``"module:function"`` with JSON arguments in all of them and
gathers their JSON results and logs. Every process runs in its own process group and is
killed on return, error, timeout or interpreter exit; a failure raises
:class:`ProcessFailed` with the failing process's traceback.

Cluster launch recipes (SLURM, Kubernetes) are in :mod:`labkit.parallel.cluster`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from labkit.core.types import JSON

__all__ = [
    "LaunchTimeout",
    "ProcessFailed",
    "Run",
    "alive",
    "children_running",
    "cpu_collectives_on",
    "echo",
    "fail",
    "free_port",
    "hold",
    "launch",
    "listening",
    "until_preempted",
]

# What a coordinator whose port was taken says (gRPC cannot bind, so no RPC server).
ADDRESS_IN_USE = re.compile(
    r"address already in use|failed to add port|failed to start rpc server", re.IGNORECASE
)


class ProcessFailed(RuntimeError):
    """A launched process exited non-zero; the message holds its traceback or log tail."""

    def __init__(
        self,
        message: str,
        process_id: int,
        returncodes: list[int | None],
        logs: list[str],
        pids: list[int],
        exit_times: list[float | None],
    ) -> None:
        super().__init__(message)
        self.process_id, self.returncodes, self.logs = process_id, returncodes, logs
        self.pids = pids  # every launched process (all stopped by the time this is raised)
        self.exit_times = exit_times  # unix time each exit was seen (None: killed by us)


class LaunchTimeout(ProcessFailed):
    """The processes did not all finish within ``timeout_s``; all were killed."""


@dataclasses.dataclass(frozen=True)
class Run:
    """A finished launch: one JSON result and one log per process, pids and timings."""

    results: list[JSON]  # what the target returned in each process
    logs: list[str]
    pids: list[int]
    port: int
    seconds: float  # wall time of the successful attempt, start to last exit
    startup_s: list[float]  # per process: spawn to jax.distributed.initialize done
    attempts: int  # 1 unless the coordinator port was taken and a new one was tried


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now: bind to port 0, read it, close (another may take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (``os.kill(pid, 0)`` plus /proc state)."""
    if pid <= 0:  # os.kill would address a process group (0) or every process (-1)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _child_env(process_id: int, cpu_devices: int, platform: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", LABKIT_PROCESS_ID=str(process_id))
    if platform == "cpu":
        env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(cpu_devices))
    else:
        env.pop("JAX_PLATFORMS", None)  # the parent's setup() may have chosen cpu
    return env


def _tail(text: str, lines: int = 25) -> str:
    """The last lines of a log, without the C++ stack dump of an aborted process."""
    text = text.split("*** Check failure stack trace", 1)[0]
    return "\n".join(text.strip().splitlines()[-lines:])


class LaunchSpec(TypedDict):
    """What :func:`launch` hands each process (as JSON in a file)."""

    target: str
    args: dict[str, JSON]
    num_processes: int
    coordinator_address: str
    cpu_devices: int
    platform: str
    initialization_timeout: int
    heartbeat_timeout_seconds: int
    spawned_at: NotRequired[float]  # unix time, set when the processes start


def _attempt(
    spec: LaunchSpec, ids: Sequence[int], tmp: Path, timeout_s: float, grace_s: float
) -> tuple[list[subprocess.Popen[bytes]], list[int | None], list[float | None], float]:
    """Start one process per id, wait for all (or a failure + grace, or the timeout), kill all."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        start = time.perf_counter()
        spec = {**spec, "spawned_at": time.time()}
        for i in ids:
            (tmp / f"spec-{i}.json").write_text(json.dumps({**spec, "process_id": i}))
            with open(tmp / f"log-{i}.txt", "wb") as log:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "labkit.parallel.distributed",
                        str(tmp / f"spec-{i}.json"),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=_child_env(i, spec["cpu_devices"], spec["platform"]),
                )
            procs.append(proc)
        codes: list[int | None] = [None] * len(procs)
        exits: list[float | None] = [None] * len(procs)
        deadline, failed_at = start + timeout_s, None
        while time.perf_counter() < deadline and any(c is None for c in codes):
            codes = [p.poll() for p in procs]
            exits = [
                e or (time.time() if c is not None else None)
                for e, c in zip(exits, codes, strict=True)
            ]
            if failed_at is None and any(c not in (None, 0) for c in codes):
                failed_at = time.perf_counter()
            if failed_at is not None and time.perf_counter() > failed_at + grace_s:
                break
            time.sleep(0.05)
        return procs, codes, exits, time.perf_counter() - start
    finally:
        for p in procs:
            _kill_group(p.pid)
            p.wait()


def launch(
    target: str,
    args: Mapping[str, JSON] | None = None,
    num_processes: int = 2,
    cpu_devices: int = 4,
    *,
    platform: str = "cpu",
    timeout_s: float = 120.0,
    initialization_timeout: int = 60,
    heartbeat_timeout_seconds: int = 100,
    grace_s: float = 2.0,
    port: int | None = None,
    process_ids: Sequence[int] | None = None,
    retries: int = 3,
) -> Run:
    """Run ``target`` (``"module:function"``, called as ``fn(**args)``) in ``num_processes``.

    Each process calls ``jax.distributed.initialize`` on ``127.0.0.1:port`` (a free port
    unless given) with ``cpu_devices`` CPU devices (``platform="cpu"``) or one GPU each
    (``platform="gpu"``), then returns ``fn``'s JSON-serialisable result. ``process_ids``
    starts only some of the processes here (the rest would run elsewhere). After the first
    failure the others get ``grace_s`` seconds to finish, then all are killed and
    :class:`ProcessFailed` is raised; a port taken by someone else is retried ``retries`` times.
    """
    if ":" not in target:
        raise ValueError(f"target must be 'module:function', got {target!r}")
    if platform not in ("cpu", "gpu"):
        raise ValueError(f"platform must be 'cpu' or 'gpu', got {platform!r}")
    json.dumps(dict(args or {}))  # fail here, not in every child, on non-JSON arguments
    ids = list(range(num_processes) if process_ids is None else process_ids)
    for attempt in range(1, retries + 1):
        chosen = port if port is not None else free_port()
        spec: LaunchSpec = {
            "target": target,
            "args": dict(args or {}),
            "num_processes": num_processes,
            "coordinator_address": f"127.0.0.1:{chosen}",
            "cpu_devices": cpu_devices,
            "platform": platform,
            "initialization_timeout": initialization_timeout,
            "heartbeat_timeout_seconds": heartbeat_timeout_seconds,
        }
        with tempfile.TemporaryDirectory(prefix="labkit-dist-") as name:
            tmp = Path(name)
            procs, codes, exits, seconds = _attempt(spec, ids, tmp, timeout_s, grace_s)
            logs = [(tmp / f"log-{i}.txt").read_text(errors="replace") for i in ids]
            errors = {i: tmp / f"error-{i}.txt" for i in ids}
            found = [
                json.loads(f.read_text()) if (f := tmp / f"result-{i}.json").exists() else None
                for i in ids
            ]
            done = [f for f in found if f is not None]
            if all(c == 0 for c in codes) and len(done) == len(ids):
                pids, results = [p.pid for p in procs], [f["value"] for f in done]
                startup = [f["ready_at"] - f["spawned_at"] for f in done]
                return Run(results, logs, pids, chosen, seconds, startup, attempt)
            if port is None and attempt < retries and 0 in ids and codes[ids.index(0)]:
                said = errors[0].read_text() if errors[0].exists() else ""
                if ADDRESS_IN_USE.search(said + logs[ids.index(0)]):
                    continue  # the coordinator lost the port race: try a fresh one
            raise _failure(ids, procs, codes, exits, logs, errors, seconds, timeout_s)
    raise AssertionError("unreachable")  # pragma: no cover


def _failure(
    ids: Sequence[int],
    procs: Sequence[subprocess.Popen[bytes]],
    codes: Sequence[int | None],
    exits: list[float | None],
    logs: list[str],
    errors: Mapping[int, Path],
    seconds: float,
    timeout_s: float,
) -> ProcessFailed:
    states = ", ".join(
        f"{i}: {'killed (still running)' if c is None else f'exit {c}'}"
        for i, c in zip(ids, codes, strict=True)
    )
    bad = [k for k, c in enumerate(codes) if c not in (None, 0)]
    if not bad:
        return LaunchTimeout(
            f"processes still running after {timeout_s:g} s were killed ({states}). Last log "
            f"lines of process {ids[0]}:\n{_tail(logs[0])}\nRaise timeout_s if the work "
            "is slow; a hang usually means a process waits for a peer that never comes.",
            ids[0],
            list(codes),
            logs,
            [p.pid for p in procs],
            exits,
        )
    k = min(bad, key=lambda b: exits[b] or 0.0)  # the first to exit: the cause, usually
    i = ids[k]
    why = errors[i].read_text() if errors[i].exists() else _tail(logs[k])
    return ProcessFailed(
        f"process {i} of {len(ids)} failed with exit code {codes[k]} after {seconds:.1f} s "
        f"({states}); all were stopped. Its traceback or last log lines:\n{why}",
        i,
        list(codes),
        logs,
        [p.pid for p in procs],
        exits,
    )


# ---------------------------------------------------------------------------------------
# Child side


def cpu_collectives_on(address: str = "127.0.0.1") -> None:
    """Make JAX's CPU collectives (gloo) listen on ``address`` in this process.

    JAX creates gloo with no address, so gloo listens on whatever this machine's host name
    resolves to, often an address other machines can reach. JAX has no option for it: the
    CPU backend is registered again with gloo made on ``address``. Call it after
    ``jax.distributed.initialize`` and before the first JAX computation.
    """
    from jax._src import distributed as jax_distributed
    from jax._src import xla_bridge
    from jax._src.lib import _jax

    def cpu_client() -> Any:
        gloo = _jax.make_gloo_tcp_collectives(
            distributed_client=jax_distributed.global_state.client, hostname=address
        )
        return xla_bridge.make_cpu_client(collectives=gloo)

    xla_bridge.register_backend_factory("cpu", cpu_client, priority=0, fail_quietly=False)


def _child(spec_path: str) -> int:
    """Run in a launched process: initialize JAX's distributed runtime, call the target."""
    spec = json.loads(Path(spec_path).read_text())
    out, i = Path(spec_path).parent, spec["process_id"]
    try:
        import jax

        if spec["platform"] == "cpu":
            jax.config.update("jax_num_cpu_devices", spec["cpu_devices"])
        jax.distributed.initialize(
            coordinator_address=spec["coordinator_address"],
            # JAX's default binds the coordinator to every interface ([::]:port)
            coordinator_bind_address=spec["coordinator_address"],
            num_processes=spec["num_processes"],
            process_id=i,
            local_device_ids=[i] if spec["platform"] == "gpu" else None,
            initialization_timeout=spec["initialization_timeout"],
            heartbeat_timeout_seconds=spec["heartbeat_timeout_seconds"],
        )
        if spec["platform"] == "cpu":
            cpu_collectives_on("127.0.0.1")
        ready_at = time.time()
        module, name = spec["target"].split(":", 1)
        result = getattr(importlib.import_module(module), name)(**spec["args"])
        found = {"value": result, "ready_at": ready_at, "spawned_at": spec["spawned_at"]}
        (out / f"result-{i}.json").write_text(json.dumps(found))
        jax.distributed.shutdown()
    except Exception:  # every error goes to the parent, with its traceback
        (out / f"error-{i}.txt").write_text(traceback.format_exc())
        os._exit(1)  # not sys.exit: JAX's atexit shutdown would wait for the healthy peers
    return 0


# ---------------------------------------------------------------------------------------
# Launch targets for trying a launch, and a check that nothing was left running


def echo(**kwargs: JSON) -> dict[str, JSON]:
    """A launch target: this process's index, count, pid and device ids, plus ``kwargs``."""
    import jax

    return {
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "pid": os.getpid(),
        "local_device_ids": [d.id for d in jax.local_devices()],
        "num_devices": len(jax.devices()),
        **kwargs,
    }


def fail(process_id: int = 0, seconds: float = 0.0) -> None:
    """A launch target: process ``process_id`` raises ValueError after ``seconds``, others wait."""
    import jax

    time.sleep(seconds)
    if jax.process_index() == process_id:
        raise ValueError(f"process {process_id} failed on purpose")
    time.sleep(3600)


def listening(pids: Sequence[int]) -> list[tuple[str, int, int]]:
    """``(address, port, pid)`` of every TCP socket that ``pids`` listen on (Linux /proc)."""
    inodes: dict[str, int] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    if (link := os.readlink(fd)).startswith("socket:["):
                        inodes[link[8:-1]] = pid
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: TCP_LISTEN
                    address, port = fields[1].split(":")
                    found.append((_address(address), int(port, 16), inodes[fields[9]]))
    return found


def _address(hex_text: str) -> str:
    """An address of /proc/net/tcp{,6} (little-endian 32-bit words) as text; an IPv4 address
    on an IPv6 socket (``::ffff:127.0.0.1``, as gRPC binds) as the IPv4 address it is."""
    raw = b"".join(bytes.fromhex(hex_text[i : i + 8])[::-1] for i in range(0, len(hex_text), 8))
    address = ipaddress.ip_address(raw)
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def hold(seconds: float = 3.0) -> int:
    """A launch target: a sum across every process (all connections up), then ``seconds`` of
    waiting (time to look at the processes from outside); returns the sum, the device count."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    ones = np.ones((jax.local_device_count(),), np.float32)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("x")), ones)
    total = int(jax.jit(lambda a: a.sum())(x))
    time.sleep(seconds)
    return total


def until_preempted(steps: int = 600, period_s: float = 0.2) -> dict[str, JSON]:
    """A launch target: one all-reduce per step until JAX's preemption notice reaches a sync
    point (a SIGTERM to any process: ``scancel``, a scheduler's eviction), then return.

    Each step prints ``step k sum=... t=<unix time>``; at the sync point every process prints
    ``preempted at step k t=...`` (the step where a training loop writes its checkpoint) and
    returns ``{"preempted_at": k}``; ``None`` if no notice came within ``steps``.
    """
    import jax
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    ones = np.ones((jax.local_device_count(),), np.float32)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("x")), ones)
    total = jax.jit(lambda a: a.sum())
    for k in range(steps):
        if multihost_utils.reached_preemption_sync_point(k):
            print(f"preempted at step {k} t={time.time():.3f}", flush=True)
            return {"preempted_at": k}
        print(f"step {k} sum={float(total(x)):g} t={time.time():.3f}", flush=True)
        time.sleep(period_s)
    return {"preempted_at": None}


def children_running() -> list[int]:
    """Pids of this process's children still running ``labkit.parallel.distributed`` (/proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue  # the process ended while we looked
        if (
            int(fields[1]) == os.getpid()
            and fields[0] != "Z"
            and b"labkit.parallel.distributed" in cmdline
        ):
            found.append(int(stat.parent.name))
    return found


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
