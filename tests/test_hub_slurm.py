"""The room on SLURM: `make hub` with the kit's batchspawner config, on a real SLURM cluster.

A one-node cluster on loopback (labkit.parallel.local_slurm) stands in for a site's; two
learners are the site's accounts (system users in a group, private homes, made here and
removed after). The hub starts as `make hub` starts it (tools/hub/hubctl.py, from .venv-hub)
with tools/hub/batchspawner_config.py and a site file holding what a site changes
(partition, no GPUs, the hub's API on loopback, a token for this test). Through the hub's
REST API both learners' servers start as SLURM jobs, as those learners; each answers
through the proxy; each learner's files are theirs alone; no server listens beyond loopback
(``ss -ltn`` sampled throughout); stopping a server cancels its job, and stopping the room
and the cluster leaves no process, listener, account or file.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hub_files import HUB, HUB_ENV, HUB_PYTHON, load, unreadable_by
from listeners import ListenerWatch

from labkit.core import progress
from labkit.parallel import local_slurm
from labkit.parallel.distributed import alive, free_port, listening


def _learner_problem() -> str | None:
    """Why learners' jobs could not run the kit's Python here (a private folder), or None."""
    if os.geteuid() != 0 or not HUB_PYTHON.exists():
        return None
    problem: str | None = load("build_env").learner_problem(HUB_PYTHON)
    return problem


pytestmark = [
    pytest.mark.skipif(
        not (HUB_ENV / ".labkit-installed").exists(),
        reason="no .venv-hub: run `make setup-hub` (make test builds it first)",
    ),
    pytest.mark.skipif(
        local_slurm.can_start() is not None,
        reason=f"no SLURM cluster can start here: {local_slurm.can_start()}",
    ),
    pytest.mark.skipif(
        _learner_problem() is not None,
        reason=f"learners' jobs cannot run the kit's Python here: {_learner_problem()}",
    ),
]

SITE = """# What a site changes in tools/hub/batchspawner_config.py (here: this machine's cluster).
import os
c = get_config()
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{{os.environ['LABKIT_HUB_API_PORT']}}"
c.SlurmSpawner.req_partition = "{partition}"
c.SlurmSpawner.req_gres = ""  # no GPUs here
c.SlurmSpawner.req_memory = ""
c.SlurmSpawner.req_nprocs = "1"
c.SlurmSpawner.req_runtime = "0:20:00"
c.Spawner.http_timeout = 120
c.Spawner.start_timeout = 180
c.JupyterHub.services.append({{"name": "labkit-test", "api_token": "{token}"}})
c.JupyterHub.load_roles.append({{"name": "labkit-test",
    "scopes": ["admin:users", "admin:servers", "access:servers"], "services": ["labkit-test"]}})
"""


@dataclass
class SlurmRoom:
    """A room on a SLURM cluster: its URL, token, state, group, learners, cluster, watch."""

    url: str
    token: str
    state: Path
    group: str
    learners: list[str]
    slurm: local_slurm.LocalSlurm
    watch: ListenerWatch
    times: dict[str, float]

    def api(self, method: str, path: str) -> tuple[int, Any]:
        """Call the hub's REST API (or a server, through the proxy) with the test's token."""
        request = urllib.request.Request(
            f"{self.url}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                body = response.read()
                return response.status, json.loads(body) if body else None
        except urllib.error.HTTPError as error:
            return error.code, None

    def jobs(self) -> list[tuple[str, str, str]]:
        """(job id, user, state) of every job in the cluster."""
        out = self.slurm.run(["squeue", "--noheader", "--format=%i %u %T"]).stdout
        return [tuple(line.split()) for line in out.splitlines()]  # type: ignore[misc]


def _hubctl(
    state: Path, group: str, *args: str, conf: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """hubctl as `make hub` runs it; ``conf``: the cluster's slurm.conf, for the hub's sbatch,
    squeue and scancel (and, kept by the recipe, for the jobs' srun)."""
    cmd = [str(HUB_PYTHON), str(HUB / "hubctl.py"), "--state", str(state), "--group", group]
    env = {**os.environ, **({"SLURM_CONF": str(conf)} if conf else {})}
    return subprocess.run(
        [*cmd, *args], capture_output=True, text=True, timeout=300, check=False, env=env
    )


def _remove_accounts(names: list[str], group: str) -> None:
    for name in names:
        subprocess.run(["userdel", "--remove", name], capture_output=True, check=False)
    subprocess.run(["groupdel", group], capture_output=True, check=False)


@pytest.fixture(scope="module")
def room() -> Iterator[SlurmRoom]:
    """The cluster, two site accounts, the hub with the SLURM recipe; all removed after."""
    labhub = load("labhub")
    tag = secrets.token_hex(3)
    group, learners = f"lkt{tag}", [f"lkt{tag}a", f"lkt{tag}b"]
    top = Path(tempfile.mkdtemp(prefix="labkit-room-slurm-"))
    os.chmod(top, 0o755)  # the learners' jobs read the cluster's slurm.conf under it
    token = secrets.token_hex(16)
    site = top / "site.py"
    site.write_text(SITE.format(partition="lab", token=token))
    os.chmod(site, 0o600)
    watch = ListenerWatch().__enter__()
    t0 = time.perf_counter()
    slurm = local_slurm.start(top / "slurm", nodes=1)
    times = {"cluster up": time.perf_counter() - t0}
    for name in learners:  # the site's accounts
        labhub.ensure_learner(name, group)
    port = free_port()
    room = SlurmRoom(
        f"http://127.0.0.1:{port}", token, top / "hub", group, learners, slurm, watch, times
    )
    try:
        t0 = time.perf_counter()
        extra = ["--extra-config", str(HUB / "batchspawner_config.py"), "--extra-config", str(site)]
        args = ["start", "--port", str(port), "--gpus", "none", "--admin", f"ins{tag}", *extra]
        done = _hubctl(room.state, group, *args, conf=slurm.conf)
        assert done.returncode == 0, done.stdout + done.stderr
        times["hub start"] = time.perf_counter() - t0
        yield room
    finally:
        _hubctl(room.state, group, "stop", conf=slurm.conf)
        slurm.stop()
        watch.__exit__()
        _remove_accounts([*learners, f"ins{tag}"], group)
        shutil.rmtree(top, ignore_errors=True)
        rounded = {k: round(v, 1) for k, v in times.items()}
        print(f"room on SLURM timings (s): {json.dumps(rounded)}")


@pytest.fixture(scope="module")
def servers(room: SlurmRoom) -> dict[str, dict[str, Any]]:
    """Both learners' servers, started through the hub's API at once; their hub records."""
    t0 = time.perf_counter()
    for name in room.learners:
        assert room.api("POST", f"/hub/api/users/{name}")[0] in (201, 409)
        assert room.api("POST", f"/hub/api/users/{name}/server")[0] in (201, 202)
    found: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 240
    while len(found) < len(room.learners):
        assert time.monotonic() < deadline, (found, room.jobs(), _log_tail(room))
        for name in room.learners:
            status, user = room.api("GET", f"/hub/api/users/{name}")
            if status == 200 and (user["servers"].get("") or {}).get("ready"):
                found[name] = user["servers"][""]
        time.sleep(0.5)
    room.times["2 servers ready"] = time.perf_counter() - t0
    return found


def _log_tail(room: SlurmRoom) -> str:
    log = room.state / "jupyterhub.log"
    return "\n".join(log.read_text().splitlines()[-40:]) if log.exists() else ""


def _server_pids(name: str) -> list[int]:
    """Live jupyterhub-singleuser processes of the learner ``name``."""
    uid = pwd.getpwnam(name).pw_uid
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
                if proc.stat().st_uid == uid and b"jupyterhub-singleuser" in cmdline:
                    found.append(int(proc.name))
            except OSError:
                continue
    return [p for p in found if alive(p)]


def test_each_learners_server_is_a_slurm_job_run_as_that_learner(
    room: SlurmRoom, servers: dict[str, dict[str, Any]]
) -> None:
    jobs = room.jobs()
    assert sorted(user for _, user, _ in jobs) == sorted(room.learners), jobs
    assert {state for _, _, state in jobs} == {"RUNNING"}
    for name in room.learners:
        assert _server_pids(name), f"no server process of {name}"


def test_each_server_answers_through_the_proxy(
    room: SlurmRoom, servers: dict[str, dict[str, Any]]
) -> None:
    for name in room.learners:
        status, body = room.api("GET", f"/user/{name}/api/status")
        assert status == 200 and "started" in body, (name, status, body)
        status, body = room.api("GET", f"/user/{name}/api/contents/{progress.WORK_DIR}")
        assert status in (200, 404), status  # the server's own view of its files


def test_servers_listen_on_loopback_only(
    room: SlurmRoom, servers: dict[str, dict[str, Any]]
) -> None:
    for name in room.learners:
        sockets = listening(_server_pids(name))
        assert sockets and {address for address, _, _ in sockets} == {"127.0.0.1"}, sockets
    assert room.watch.new == set(), f"listening beyond loopback: {room.watch.new}"


def test_each_learners_files_are_private(
    room: SlurmRoom, servers: dict[str, dict[str, Any]]
) -> None:
    alice, bob = (pwd.getpwnam(n) for n in room.learners)
    for user in (alice, bob):
        home = Path(user.pw_dir)
        assert home.stat().st_mode & 0o777 == 0o700
        lesson = home / "openxla-lab" / "00_welcome.ipynb"  # copied by the job, as the learner
        assert lesson.stat().st_uid == user.pw_uid
        logs = list(home.glob("jupyterhub_slurmspawner_*.log"))
        assert logs and all(p.stat().st_uid == user.pw_uid for p in logs)
    assert unreadable_by(Path(bob.pw_dir) / "openxla-lab" / "00_welcome.ipynb", alice)


def test_stopping_cancels_the_jobs_and_leaves_nothing(
    room: SlurmRoom, servers: dict[str, dict[str, Any]]
) -> None:
    first, second = room.learners
    t0 = time.perf_counter()
    assert room.api("DELETE", f"/hub/api/users/{first}/server")[0] in (202, 204)
    deadline = time.monotonic() + 60
    while any(user == first for _, user, _ in room.jobs()) or _server_pids(first):
        assert time.monotonic() < deadline, room.jobs()
        time.sleep(0.3)
    room.times["server stop (scancel)"] = time.perf_counter() - t0
    assert [user for _, user, _ in room.jobs()] == [second]
    done = _hubctl(room.state, room.group, "stop", conf=room.slurm.conf)  # cancels the other
    assert done.returncode == 0 and "no process of it is left" in done.stdout, done.stdout
    assert room.jobs() == [] and _server_pids(second) == []
    assert room.slurm.stop() == [] and local_slurm.leftovers(room.slurm.folder) == []
    assert not (room.slurm.socket_dir and room.slurm.socket_dir.exists())  # munged's, in /run
    assert room.watch.new == set()
