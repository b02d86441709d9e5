"""A SLURM cluster on this machine, for trials and tests: ``make slurm``, ``make slurm-stop``.

:func:`start` brings up Debian's SLURM (``slurm-wlm``) without systemd, as root: its own
``munged`` (a key and a socket of its own, nothing in /etc or /run), ``slurmctld`` and one
``slurmd`` per node, every file in one folder. Nothing listens on a network address other
machines could reach:

- one node (the default): node ``localhost`` at 127.0.0.1, in this machine's network;
  ``CommunicationParameters=NoInAddrAny,NoCtldInAddrAny`` makes every daemon bind to its own
  address (without ``NoCtldInAddrAny`` slurmctld listens on 0.0.0.0);
- two nodes (``nodes=2``): two simulated hosts, each a network, mount and host-name
  namespace of its own, joined by a veth pair (10.77.0.1 and 10.77.0.2, addresses that
  exist only inside those namespaces). The controller and node 1 share the first one, where
  SLURM's commands run (:meth:`LocalSlurm.client` prefixes them with ``nsenter``).

:meth:`LocalSlurm.stop` cancels every job, stops every daemon by its pid (SIGTERM, then
SIGKILL), waits until none is left, and removes the folder it made. :func:`watch` is a
watchdog process that does the same when the process that started the cluster ends (a
notebook's kernel killed by a test runner, say). ``python -m labkit.parallel.local_slurm``
is the command line (``up``, ``down``, ``status``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from labkit.parallel.distributed import alive, free_port

__all__ = [
    "BINARIES",
    "DEFAULT_FOLDER",
    "LocalSlurm",
    "Node",
    "can_start",
    "find",
    "for_lesson",
    "leftovers",
    "namespaces_problem",
    "start",
    "watch",
]

# Debian's slurm-wlm and munge (`make slurm-deps` installs them as root).
BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sinfo", "sbatch", "srun", "scancel")
NAMESPACE_TOOLS = ("unshare", "nsenter", "ip")
DEFAULT_FOLDER = Path(__file__).resolve().parents[2] / "build" / "slurm"  # `make slurm`'s
STATE_FILE = "cluster.json"
MARKER = "LABKIT_SLURM_FOLDER"  # in every daemon's environment: how leftovers are found
SUBNET = "10.77.0"  # the simulated hosts' addresses: inside their own namespaces only
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class SlurmError(RuntimeError):
    """The cluster could not start or stop; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class Node:
    """One SLURM node: its name, its address and (simulated hosts) its namespace holder."""

    name: str
    address: str
    holder: int | None = None  # pid of the process that keeps its namespaces alive


def can_start() -> str | None:
    """None when a cluster can start here; else why not, and what to do."""
    if os.geteuid() != 0:
        return "SLURM's daemons start as root here (run `sudo make slurm`, or Jupyter as root)"
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return (
            f"{', '.join(missing)} not found: install Debian's slurm-wlm and munge "
            "(`make slurm-deps` as root)"
        )
    if not Path("/sys/fs/cgroup").is_dir() or not any(Path("/sys/fs/cgroup").iterdir()):
        return "slurmd needs /sys/fs/cgroup mounted (even with proctrack/linuxproc)"
    return None


def namespaces_problem() -> str | None:
    """None when two simulated hosts (network namespaces + a veth pair) can be made here."""
    if problem := can_start():
        return problem
    missing = [t for t in NAMESPACE_TOOLS if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not found (util-linux and iproute2)"
    probe = ["unshare", "--net", "--mount", "--uts", "ip", "link", "add", "p0", "type", "veth"]
    probe += ["peer", "name", "p1"]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        return f"cannot make a network namespace with a veth pair: {done.stderr.strip()}"
    return None


@dataclasses.dataclass
class LocalSlurm:
    """A running cluster: its folder (config, keys, state, logs), nodes and daemons' pids."""

    folder: Path
    nodes: list[Node]
    pids: dict[str, int]  # "munged", "slurmctld", "slurmd <node>", "watch"
    partition: str = "lab"
    owns_folder: bool = True  # remove the folder on stop (a folder start() made)
    cpus_per_node: int = 2
    socket_dir: Path | None = None  # munged's socket, in a folder of its own under /run
    started_s: float = 0.0  # seconds from start to every node idle
    _children: list[subprocess.Popen[bytes]] = dataclasses.field(default_factory=list)

    @property
    def conf(self) -> Path:
        """The cluster's slurm.conf (every SLURM command needs it: ``SLURM_CONF``)."""
        return self.folder / "slurm.conf"

    @property
    def namespaced(self) -> bool:
        """True when the nodes are simulated hosts in namespaces of their own."""
        return self.nodes[0].holder is not None

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment plus ``SLURM_CONF`` (and ``extra``), no proxies."""
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        env.update(SLURM_CONF=str(self.conf), **(extra or {}))
        return env

    def client(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as run where SLURM's commands reach the controller (node 1's namespaces)."""
        holder = self.nodes[0].holder
        if holder is None:
            return list(argv)
        return ["nsenter", "-t", str(holder), "-n", "-m", "-u", "--", *argv]

    def run(self, argv: Sequence[str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a SLURM command (``sinfo``, ``scontrol`` ...) against this cluster."""
        return subprocess.run(
            self.client(argv),
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout_s,
            check=False,
        )

    def address(self, node: str) -> str:
        """The address of ``node`` (what SLURM and JAX's coordinator reach it at)."""
        return next(n.address for n in self.nodes if n.name == node)

    # --- jobs ---

    def sbatch(self, script: str, workdir: Path) -> int:
        """Submit ``script`` (its text, unchanged) as a batch job run in ``workdir``."""
        done = subprocess.run(
            self.client(["sbatch", "--parsable", f"--chdir={workdir}"]),
            input=script,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise SlurmError(f"sbatch refused the script: {done.stderr.strip()}")
        return int(done.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job``'s fields of ``job_id`` (empty once SLURM forgot it)."""
        done = self.run(["scontrol", "show", "job", "--oneliner", str(job_id)])
        fields: dict[str, str] = {}
        for item in done.stdout.split():
            key, _, value = item.partition("=")
            fields.setdefault(key, value)
        return fields

    def wait(self, job_id: int, timeout_s: float = 300) -> dict[str, str]:
        """Poll a job every 0.2 s until it ended; its final fields (``sbatch --wait`` polls
        with a growing interval: 30 s late on a 10 s job here)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            fields = self.job(job_id)
            if fields.get("JobState", "") not in ("", "PENDING", "CONFIGURING", "RUNNING"):
                if fields.get("JobState") != "COMPLETING":
                    return fields
            time.sleep(0.2)
        self.run(["scancel", str(job_id)])
        raise SlurmError(f"job {job_id} did not end within {timeout_s:g} s; it was cancelled")

    def stored_script(self, job_id: int) -> str:
        """The batch script SLURM stored for ``job_id``, byte for byte."""
        done = self.run(["scontrol", "write", "batch_script", str(job_id), "-"])
        if done.returncode != 0:
            raise SlurmError(f"no stored script for job {job_id}: {done.stderr.strip()}")
        return done.stdout

    def shell(self, line: str, workdir: Path) -> subprocess.Popen[str]:
        """Start ``bash -c line`` where SLURM's commands run (an ``srun`` line, as typed)."""
        return subprocess.Popen(
            self.client(["bash", "-c", line]),
            cwd=workdir,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def jobs(self) -> list[int]:
        """Ids of the jobs SLURM still runs or holds."""
        done = self.run(["squeue", "--noheader", "--format=%A"])
        return [int(j) for j in done.stdout.split() if j.isdigit()]

    def setting(self, name: str) -> str:
        """One value of the running configuration (``scontrol show config``), e.g. KillWait."""
        for line in self.run(["scontrol", "show", "config"]).stdout.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == name:
                return value.strip()
        raise KeyError(f"{name} is not a SLURM setting of this cluster")

    # --- state ---

    def save(self) -> None:
        """Write the cluster's description (pids, nodes) to its folder, for `stop` elsewhere."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data.pop("_children")
        data.update(folder=str(self.folder), nodes=[dataclasses.asdict(n) for n in self.nodes])
        data["socket_dir"] = str(self.socket_dir) if self.socket_dir else None
        (self.folder / STATE_FILE).write_text(json.dumps(data, indent=1))

    @classmethod
    def load(cls, folder: Path) -> LocalSlurm:
        """The cluster described in ``folder`` (raises FileNotFoundError when there is none)."""
        data = json.loads((Path(folder) / STATE_FILE).read_text())
        data["folder"] = Path(data["folder"])
        data["nodes"] = [Node(**n) for n in data["nodes"]]
        data["socket_dir"] = Path(data["socket_dir"]) if data.get("socket_dir") else None
        return cls(**data)

    def running(self) -> bool:
        """True while the controller and every node daemon are alive."""
        names = ["slurmctld", *(f"slurmd {n.name}" for n in self.nodes)]
        return all(_ours(self.pids.get(name, 0), self.folder) for name in names)

    # --- the end ---

    def stop(self) -> list[str]:
        """Cancel every job, stop every daemon and namespace, remove the folder if it made it.

        Returns what was still running after SIGKILL (an empty list: nothing is left).
        """
        with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
            if self.running():
                for job in self.jobs():
                    self.run(["scancel", str(job)])
                deadline = time.monotonic() + STOP_TIMEOUT_S
                while self.jobs() and time.monotonic() < deadline:
                    time.sleep(0.2)
        # Only processes that carry this cluster's marker (a pid in an old state file may
        # belong to another process by now), and the daemons this process started.
        mine = [c.pid for c in self._children if c.poll() is None]
        left = _end([*leftovers(self.folder), *mine], STOP_TIMEOUT_S)
        for child in self._children:
            with contextlib.suppress(Exception):
                child.wait(timeout=1)
        if not left and self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
        if not left and self.owns_folder:
            shutil.rmtree(self.folder, ignore_errors=True)
        elif not left:
            (self.folder / STATE_FILE).unlink(missing_ok=True)
        return [f"{pid}: {_cmdline(pid)}" for pid in left]


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    return "?"


def _end(pids: Sequence[int], timeout_s: float) -> list[int]:
    """SIGTERM, then SIGKILL after ``timeout_s`` / 2; the pids still alive after both."""
    left = [p for p in dict.fromkeys(pids) if p > 0 and alive(p)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout_s / 2
        while left and time.monotonic() < deadline:
            left = [p for p in left if alive(p)]
            time.sleep(0.05)
        if not left:
            break
    return left


def _ours(pid: int, folder: Path) -> bool:
    """True when ``pid`` is alive and carries the marker of the cluster in ``folder``."""
    marker = f"{MARKER}={Path(folder).resolve()}".encode()
    try:
        return alive(pid) and marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def leftovers(folder: Path) -> list[int]:
    """Live processes carrying this cluster's marker (its daemons, job steps and tasks)."""
    marker = f"{MARKER}={Path(folder).resolve()}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker in (proc / "environ").read_bytes().split(b"\0") and alive(int(proc.name)):
                found.append(int(proc.name))
    return found


def _config(
    folder: Path,
    nodes: Sequence[Node],
    partition: str,
    cpus: int,
    ports: tuple[int, int],
    socket: Path,
) -> str:
    """slurm.conf: authentication by this cluster's munged, no accounting, no cgroups."""
    f = folder
    first_job = random.randrange(1, 60) * 1000 + 1  # another cluster here: other job ids
    node_lines = "\n".join(
        f"NodeName={n.name} NodeAddr={n.address} CPUs={cpus} State=UNKNOWN" for n in nodes
    )
    names = ",".join(n.name for n in nodes)
    return f"""# A SLURM cluster on this machine (labkit.parallel.local_slurm); every file in {f}.
ClusterName=labkit
SlurmctldHost={nodes[0].name}({nodes[0].address})
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
# each daemon binds to its own address, never to every interface (0.0.0.0)
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket}
StateSaveLocation={f}/state
SlurmdSpoolDir={f}/spool/%n
SlurmctldPidFile={f}/run/slurmctld.pid
SlurmdPidFile={f}/run/slurmd-%n.pid
SlurmctldLogFile={f}/log/slurmctld.log
SlurmdLogFile={f}/log/slurmd-%n.log
# no systemd, no cgroup hierarchy of our own: processes tracked by parent, no task binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
# SIGTERM to SIGKILL when a step or job ends (SLURM's default is 30 s)
KillWait=5
InactiveLimit=0
MinJobAge=300
# the JAX coordinator's port is SLURM_JOB_ID % 4096 + 61440: job ids of their own
FirstJobId={first_job}
{node_lines}
PartitionName={partition} Nodes={names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


def _socket_parent() -> str:
    """/run when it is there and writable (as root it is), else the system's temporary folder."""
    return "/run" if os.access("/run", os.W_OK) else "/tmp"


def _spawn(
    cluster: LocalSlurm, name: str, argv: list[str], holder: int | None = None
) -> subprocess.Popen[bytes]:
    """Start one daemon in the foreground (its pid is the daemon's), in a session of its own."""
    if holder is not None:
        argv = ["nsenter", "-t", str(holder), "-n", "-m", "-u", "--", *argv]
    env = cluster.env({MARKER: str(cluster.folder.resolve())})
    log = open(cluster.folder / "log" / f"{name.replace(' ', '-')}.out", "ab")
    with log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    cluster._children.append(proc)
    cluster.pids[name] = proc.pid
    return proc


def _holder(folder: Path, node: Node) -> subprocess.Popen[bytes]:
    """A process holding a new network, mount and UTS namespace: the simulated host
    ``node`` (its host name, its /etc/hosts naming both hosts, loopback up)."""
    script = (
        f"hostname {node.name} && mount --bind {folder / 'hosts'} /etc/hosts && "
        "ip link set lo up && exec sleep infinity"
    )
    proc = subprocess.Popen(
        ["unshare", "--net", "--mount", "--uts", "--propagation", "private", "sh", "-c", script],
        env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), MARKER: str(folder)},
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{proc.pid}/comm").read_text().strip() == "sleep":
                return proc
        if proc.poll() is not None:
            raise SlurmError(f"the namespace of {node.name} did not start (exit {proc.returncode})")
        time.sleep(0.02)
    raise SlurmError(f"the namespace of {node.name} did not start within 10 s")


def _link(holders: Sequence[int], nodes: Sequence[Node]) -> None:
    """A veth pair between the two namespaces, one end in each, addressed and up."""
    a, b = holders
    cmd = ["ip", "link", "add", "lab0", "netns", str(a), "type", "veth"]
    subprocess.run([*cmd, "peer", "name", "lab0", "netns", str(b)], check=True, capture_output=True)
    for holder, node in zip(holders, nodes, strict=True):
        inside = ["nsenter", "-t", str(holder), "-n", "ip"]
        subprocess.run([*inside, "addr", "add", f"{node.address}/24", "dev", "lab0"], check=True)
        subprocess.run([*inside, "link", "set", "lab0", "up"], check=True)


def start(
    folder: Path | None = None,
    nodes: int = 1,
    cpus_per_node: int = 2,
    partition: str = "lab",
    watch_pid: int | None = None,
) -> LocalSlurm:
    """Bring up a cluster of ``nodes`` (1: on loopback; 2: simulated hosts) and wait until
    every node is idle. ``folder``: where its files go (default: a new temporary folder,
    removed by ``stop``). ``watch_pid``: stop the cluster when that process ends."""
    if problem := (namespaces_problem() if nodes > 1 else can_start()):
        raise SlurmError(f"cannot start a SLURM cluster here: {problem}")
    if nodes not in (1, 2):
        raise ValueError(f"nodes must be 1 (loopback) or 2 (simulated hosts), got {nodes}")
    t0 = time.perf_counter()
    owns = folder is None
    folder = Path(folder or tempfile.mkdtemp(prefix="labkit-slurm-")).resolve()
    if (folder / STATE_FILE).exists() and LocalSlurm.load(folder).running():
        raise SlurmError(f"a cluster already runs from {folder}: stop it first (make slurm-stop)")
    folder.mkdir(parents=True, exist_ok=True)
    for sub, mode in (("key", 0o700), ("run", 0o755), ("state", 0o700), ("spool", 0o755)):
        (folder / sub).mkdir(mode=mode, exist_ok=True)
    (folder / "log").mkdir(exist_ok=True)
    # munged serves its socket only from a folder every user can reach (every folder above
    # it executable by all): not so in a private clone or a 0700 temporary folder. /run is.
    socket_dir = Path(tempfile.mkdtemp(prefix="labkit-munge-", dir=_socket_parent()))
    os.chmod(socket_dir, 0o755)
    if nodes == 1:
        members = [Node("localhost", "127.0.0.1")]
        ports = (free_port(), free_port())
    else:
        members = [Node(f"node{i}", f"{SUBNET}.{i}") for i in (1, 2)]
        ports = (6817, 6818)  # inside the namespaces: no other cluster there
        hosts = "127.0.0.1 localhost\n" + "".join(f"{n.address} {n.name}\n" for n in members)
        (folder / "hosts").write_text(hosts)
    cluster = LocalSlurm(folder, members, {}, partition, owns, cpus_per_node, socket_dir)
    try:
        if nodes > 1:
            started = [_holder(folder, n) for n in members]
            cluster._children += started  # reaped by stop()
            holders = [proc.pid for proc in started]
            pairs = zip(members, holders, strict=True)
            cluster.nodes = [dataclasses.replace(n, holder=h) for n, h in pairs]
            cluster.save()  # from here on, `stop` finds the namespaces
            _link(holders, cluster.nodes)
        _start_daemons(cluster, ports)
        cluster.started_s = time.perf_counter() - t0
        if watch_pid is not None:
            argv = [sys.executable, "-m", "labkit.parallel.local_slurm", "watch"]
            _spawn(cluster, "watch", [*argv, "--folder", str(folder), "--pid", str(watch_pid)])
        cluster.save()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _start_daemons(cluster: LocalSlurm, ports: tuple[int, int]) -> None:
    """munged, slurmctld, one slurmd per node; wait until sinfo says every node is idle."""
    folder, key = cluster.folder, cluster.folder / "key" / "munge.key"
    subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
    assert cluster.socket_dir is not None
    socket = cluster.socket_dir / "munge.socket"
    munge = ["munged", "--foreground", f"--socket={socket}", f"--key-file={key}"]
    munge += [f"--pid-file={folder / 'run' / 'munged.pid'}", f"--seed-file={folder / 'key/seed'}"]
    _spawn(cluster, "munged", [*munge, f"--log-file={folder / 'log' / 'munged.log'}"])
    _until(lambda: socket.exists(), "munged made no socket", cluster)
    cluster.conf.write_text(
        _config(folder, cluster.nodes, cluster.partition, cluster.cpus_per_node, ports, socket)
    )
    _spawn(cluster, "slurmctld", ["slurmctld", "-D"], cluster.nodes[0].holder)
    for node in cluster.nodes:
        _spawn(cluster, f"slurmd {node.name}", ["slurmd", "-D", "-N", node.name], node.holder)
    cluster.save()

    def idle() -> bool:
        out = cluster.run(["sinfo", "--noheader", "--Node", "--format=%N %t"], 10).stdout.split()
        return len(out) == 2 * len(cluster.nodes) and all(s == "idle" for s in out[1::2])

    _until(idle, "the nodes did not become idle", cluster)


def _until(ready: Callable[[], bool], what: str, cluster: LocalSlurm) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready():
        dead = [n for n, p in cluster.pids.items() if not alive(p)]
        if dead or time.monotonic() > deadline:
            logs = sorted((cluster.folder / "log").glob("*"))
            tail = "\n".join(
                f"--- {p.name}: " + " | ".join(p.read_text(errors="replace").splitlines()[-4:])
                for p in logs
            )
            why = f"{', '.join(dead)} exited" if dead else f"after {READY_TIMEOUT_S:g} s"
            raise SlurmError(f"{what} ({why}). The end of each log:\n{tail}")
        time.sleep(0.05)


def find(folder: Path | None = None) -> LocalSlurm | None:
    """A running cluster: the one of ``folder``, else of ``$SLURM_CONF``'s folder, else
    ``make slurm``'s (build/slurm); None when none runs."""
    candidates = [folder] if folder is not None else []
    if conf := os.environ.get("SLURM_CONF"):
        candidates.append(Path(conf).parent)
    candidates.append(DEFAULT_FOLDER)
    for place in candidates:
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            cluster = LocalSlurm.load(Path(place))
            if cluster.running():
                cluster.owns_folder = False  # someone else's: never removed from here
                return cluster
    return None


def for_lesson(mode: str = "auto", nodes: int = 2) -> tuple[LocalSlurm | None, str]:
    """A cluster for a notebook, and one line saying which (or why there is none).

    ``mode="auto"``: a running cluster (``make slurm``, ``$SLURM_CONF``) if there is one; else,
    as root, a cluster of this process's own (``nodes`` simulated hosts when namespaces can
    be made here, else one node), stopped by its ``stop()`` or by a watchdog when this process
    ends. ``mode="off"``: none.
    """
    if mode not in ("auto", "off"):
        raise ValueError(f'SLURM mode must be "auto" or "off", got {mode!r}')
    if mode == "off":
        return None, 'no SLURM cluster: SLURM = "off"'
    if (running := find()) is not None:
        return running, f"using the running cluster: {_nodes(running)}, files in {running.folder}"
    if problem := can_start():
        return None, f"no SLURM cluster runs, and none can start here: {problem}"
    one = namespaces_problem() if nodes > 1 else None
    cluster = start(nodes=1 if one else nodes, watch_pid=os.getpid())
    said = f"started a cluster for this notebook in {cluster.started_s:.1f} s: {_nodes(cluster)}"
    return cluster, said + (f" (one node: {one})" if one else "")


def _nodes(cluster: LocalSlurm) -> str:
    where = "simulated hosts" if cluster.namespaced else "this machine's loopback"
    names = ", ".join(f"{n.name} ({n.address})" for n in cluster.nodes)
    return f"{len(cluster.nodes)} node(s) {names} on {where}"


def watch(folder: Path, pid: int, period_s: float = 0.5) -> int:
    """Wait while ``pid`` lives, then stop the cluster of ``folder`` (a watchdog)."""
    while alive(pid) and (folder / STATE_FILE).exists():
        time.sleep(period_s)
    if not (folder / STATE_FILE).exists():
        return 0  # stopped by its owner
    left = LocalSlurm.load(folder).stop()
    return 1 if left else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``up``, ``down``, ``status`` (``make slurm``, ``make slurm-stop``) and ``watch``."""
    top = argparse.ArgumentParser(prog="python -m labkit.parallel.local_slurm")
    top.add_argument("command", choices=["up", "down", "status", "watch"])
    top.add_argument("--folder", type=Path, default=DEFAULT_FOLDER, help="(build/slurm)")
    top.add_argument("--nodes", type=int, default=1, help="1 (loopback) or 2 (simulated)")
    top.add_argument("--pid", type=int, help="watch: the process to outlive")
    args = top.parse_args(argv)
    folder = args.folder.resolve()
    if args.command == "watch":
        return watch(folder, args.pid)
    running = find(folder)
    if args.command == "status":
        print(_describe(running) if running else f"no SLURM cluster runs from {folder}")
        return 0 if running else 1
    if args.command == "down":
        if running is None:
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                running = LocalSlurm.load(folder)  # a cluster half up: stop what is left
        if running is None:
            print(f"no SLURM cluster runs from {folder}: nothing to stop")
            return 0
        left = running.stop()
        if not left:
            shutil.rmtree(folder, ignore_errors=True)
        print(f"stopped the SLURM cluster of {folder}" if not left else f"still running: {left}")
        return 1 if left else 0
    if running is not None:
        print(f"already running: {_describe(running)}")
        return 0
    try:
        cluster = start(folder, nodes=args.nodes)
    except SlurmError as exc:
        print(f"error: {exc}")
        return 1
    cluster.owns_folder = False
    print(_describe(cluster))
    return 0


def _describe(cluster: LocalSlurm) -> str:
    nodes = ", ".join(f"{n.name} ({n.address})" for n in cluster.nodes)
    how = (
        f"export SLURM_CONF={cluster.conf}"
        if not cluster.namespaced
        else f"SLURM_CONF={cluster.conf} {' '.join(cluster.client([]))} sinfo"
    )
    stop = (
        "make slurm-stop"
        if cluster.folder == DEFAULT_FOLDER
        else f"python -m labkit.parallel.local_slurm down --folder {cluster.folder}"
    )
    return (
        f"SLURM cluster up: {len(cluster.nodes)} node(s) {nodes}, partition "
        f"{cluster.partition}, files in {cluster.folder}\n  use it: {how}\n"
        f"  stop it: {stop}"
    )


if __name__ == "__main__":
    sys.exit(main())
