"""Start and stop the room's JupyterHub: ``make hub`` and ``make hub-stop``.

Usage: .venv-hub/bin/python tools/hub/hubctl.py start [--ip IP] [--port PORT] [...]
       .venv-hub/bin/python tools/hub/hubctl.py stop | status

``start`` generates the cookie secret and the proxy token (mode 0600, never printed) in the
state folder (default build/hub, mode 0700), starts JupyterHub in a session of its own and
returns once it answers. ``stop`` sends it SIGTERM: JupyterHub stops every learner's server,
their kernels, the idle culler and the proxy. Then it looks for anything the room left (a
process carrying the room's state folder in its environment, or run by one of the room's
learners) and ends it, so that no process of the room is left.
"""

from __future__ import annotations

import argparse
import grp
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_env
import labhub

HERE = Path(__file__).resolve().parent
STATE = labhub.KIT / "build" / "hub"
READY_TIMEOUT_S = 120
STOP_TIMEOUT_S = 60


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def hub_pid(state: Path) -> int | None:
    """The pid of the room's running JupyterHub, from its pid file; None if none runs."""
    try:
        pid = int((state / "jupyterhub.pid").read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def answers(url: str) -> bool:
    """True once the hub's REST API answers at ``url``."""
    try:
        with urllib.request.urlopen(f"{url}hub/api/", timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def room_processes(state: Path, group: str | None) -> list[int]:
    """Processes of the room: its state folder in their environment, or a learner's own."""
    marker = f"LABKIT_HUB_STATE={state}".encode()
    learners: set[int] = set()
    if group is not None:
        try:
            entry = grp.getgrnam(group)
            learners = {
                u.pw_uid
                for u in pwd.getpwall()
                if u.pw_gid == entry.gr_gid or u.pw_name in entry.gr_mem
            }
        except KeyError:
            pass
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            ours = marker in (proc / "environ").read_bytes().split(b"\0")
            ours = ours or proc.stat().st_uid in learners
        except OSError:
            continue
        if ours:
            found.append(int(proc.name))
    return found


def end(pids: list[int], timeout_s: float = 10) -> list[int]:
    """SIGTERM, then SIGKILL after ``timeout_s``; returns the pids still alive after that."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + timeout_s
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]
            time.sleep(0.2)
        if not pids:
            break
    return pids


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def start(args: argparse.Namespace) -> int:
    """Start the hub; return once it answers (0) or with its log's end (1)."""
    state = Path(args.state).resolve()
    url = f"http://{args.ip}:{args.port}/"
    if hub_pid(state) is not None:
        print(f"the room is already open at {url} (state {state}); `make hub-stop` first")
        return 1
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o700)
    labhub.write_secret(state / "jupyterhub_cookie_secret")
    labhub.write_secret(state / "proxy_token")
    gpus = labhub.detect_gpus() if args.gpus == "auto" else labhub.parse_gpus(args.gpus)
    system_users = os.geteuid() == 0 and not args.same_user
    if system_users:
        if problem := build_env.learner_problem(Path(sys.executable), Path(args.kit_env)):
            print(f"error: {problem}")
            return 1
        labhub.ensure_group(args.group)
    env = {
        **os.environ,
        "LABKIT_HUB_STATE": str(state),
        "LABKIT_HUB_IP": args.ip,
        "LABKIT_HUB_PORT": str(args.port),
        "LABKIT_HUB_API_PORT": str(free_port()),
        "LABKIT_HUB_PROXY_API_PORT": str(free_port()),
        "LABKIT_HUB_KIT_ENV": str(Path(args.kit_env).resolve()),
        "LABKIT_HUB_ADMIN": args.admin,
        "LABKIT_HUB_ACCOUNTS": str(Path(args.accounts).resolve()) if args.accounts else "",
        "LABKIT_HUB_SIGNUP": "0" if args.no_signup else "1",
        "LABKIT_HUB_GROUP": args.group,
        "LABKIT_HUB_SYSTEM_USERS": "1" if system_users else "0",
        "LABKIT_HUB_GPUS": ",".join(gpus) or "none",
        "LABKIT_HUB_LEARNERS_PER_GPU": str(args.learners_per_gpu),
        "LABKIT_HUB_IDLE_TIMEOUT": str(args.idle_timeout),
        "LABKIT_HUB_EXTRA_CONFIG": os.pathsep.join(
            str(Path(f).resolve()) for f in args.extra_config or []
        ),
    }
    log_path = state / "jupyterhub.log"
    cmd = [sys.executable, "-m", "jupyterhub", "-f", str(HERE / "jupyterhub_config.py")]
    with log_path.open("a") as log:
        hub = subprocess.Popen(
            cmd, cwd=state, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not answers(url):
        if hub.poll() is not None or time.monotonic() > deadline:
            tail = "\n".join(log_path.read_text().splitlines()[-25:])
            print(f"error: JupyterHub did not start; the end of {log_path}:\n{tail}")
            if hub.poll() is None:
                end([hub.pid])
            end(room_processes(state, None))
            return 1
        time.sleep(0.5)
    mode = "GPUs " + ", ".join(gpus) if gpus else "CPU mode (no GPU found)"
    print(f"the room is open at {url} (JupyterHub pid {hub.pid}, log {log_path})")
    print(f"  instructor: {args.admin}; password in {state / 'passwords.txt'} (mode 0600)")
    print(f"  learners sign up at {url}hub/signup; approve them at {url}hub/authorize")
    if gpus:
        share = labhub.memory_fraction(args.learners_per_gpu)
        print(f"  {mode}, round robin; each kernel may use {share:.0%} of its GPU's memory")
    else:
        print(f"  {mode}; idle servers stop after {args.idle_timeout} s")
    if not system_users:
        print("  every learner's server runs as you: no separation by the OS (a trial)")
    print("  stop it with `make hub-stop`")
    return 0


def stop(args: argparse.Namespace) -> int:
    """Stop the hub and everything of the room; 0 when no process is left."""
    state = Path(args.state).resolve()
    pid = hub_pid(state)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)  # the hub stops servers, kernels, culler and proxy
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while Path(f"/proc/{pid}").exists() and not _zombie(pid):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
    group = args.group if os.geteuid() == 0 else None
    left = room_processes(state, group)
    alive = end(left)
    if alive:
        print(f"error: processes of the room still alive after SIGKILL: {alive}")
        return 1
    what = "stopped" if pid is not None else "was not running"
    extra = f"; ended {len(left)} process(es) it left" if left else ""
    print(f"the room {what} (state {state}){extra}; no process of it is left")
    return 0


def status(args: argparse.Namespace) -> int:
    """Say whether the room is open; 0 if it is."""
    pid = hub_pid(Path(args.state).resolve())
    print(f"the room is open (JupyterHub pid {pid})" if pid else "the room is not running")
    return 0 if pid else 1


def parser() -> argparse.ArgumentParser:
    """The command line of hubctl."""
    top = argparse.ArgumentParser(prog="hubctl", description="The room's JupyterHub.")
    top.add_argument("--state", default=str(STATE), help="state folder (default build/hub)")
    top.add_argument("--group", default=labhub.LEARNERS_GROUP, help="the learners' group")
    sub = top.add_subparsers(dest="command", required=True)
    go = sub.add_parser("start", help="start the hub")
    go.add_argument("--ip", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    go.add_argument("--port", type=int, default=8000, help="port (8000)")
    go.add_argument("--kit-env", default=str(labhub.KIT / ".venv"), help="the kit's env")
    go.add_argument("--admin", default="instructor", help="the instructor's user name")
    go.add_argument("--accounts", help="file of learners' user names to create, one a line")
    go.add_argument("--no-signup", action="store_true", help="no sign-up page")
    go.add_argument("--gpus", default="auto", help='"auto", "none" or ids: "0,1", MIG UUIDs')
    go.add_argument("--learners-per-gpu", type=int, default=4, help="sets each memory share")
    go.add_argument("--idle-timeout", type=int, default=3600, help="seconds before culling")
    go.add_argument(
        "--same-user", action="store_true", help="root: run servers as root, not as learners"
    )
    go.add_argument(
        "--extra-config",
        action="append",
        metavar="FILE",
        help="a config file loaded after the room's (repeatable; e.g. the SLURM recipe, "
        "tools/hub/batchspawner_config.py, then your site's values)",
    )
    sub.add_parser("stop", help="stop the hub and every process of the room")
    sub.add_parser("status", help="is the room open?")
    return top


def main(argv: list[str]) -> int:
    """Run one hubctl command."""
    args = parser().parse_args(argv)
    return {"start": start, "stop": stop, "status": status}[args.command](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
