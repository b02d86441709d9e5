"""The room in a real browser: `make hub`'s JupyterHub with three learners at once, in Chromium.

The hub starts as `make hub` starts it (tools/hub/hubctl.py, from .venv-hub), on 127.0.0.1,
a free port and a temporary state folder. Three learners sign up, are refused until the
instructor approves them in the browser, log in at the same time and run a kernel check
(tests/notebook_files.py: 8 devices, an H100 compile, a plot, lesson 00's checkers) all at
once, each in their own server. Then: one learner cannot reach another's server, files or
hub record; a wrong password is refused; `labkit room` shows the three; `hubctl stop` leaves
no process. As root the learners are system users (created by the hub, removed here), so
their files are separated by the OS too; otherwise all servers run as this user.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from chromium import (
    PageLog,
    browser,
    fresh_lab,
    needs_chromium,
    start_run_all,
    wait_run_all_passed,
)
from hub_files import HUB_ENV, HUB_PYTHON, HUBCTL, ROOT, account_exists, load, unreadable_by
from notebook_files import kernel_check_notebook

from labkit.core import progress

OUT = ROOT / "build" / "browser"
CHECK = "kernel_check.ipynb"  # what each learner runs (tests/notebook_files.py)


RUN_ALL_TIMEOUT_MS = 240_000  # three kernel checks at once on two cores (~20 s here)
PASSWORD = "a-long-lab-pass-" + secrets.token_hex(4)

pytestmark = [
    needs_chromium,
    pytest.mark.notebook,
    pytest.mark.skipif(
        not (HUB_ENV / ".labkit-installed").exists(),
        reason="no .venv-hub: run `make setup-hub` (make test builds it first)",
    ),
]


@dataclass
class Room:
    """A running room: its URL, state folder, instructor, learners and the learners' group."""

    url: str
    state: Path
    group: str
    admin: str
    admin_password: str
    learners: list[str]
    system_users: bool  # learners as system users (as root), else all servers run as us
    times: dict[str, float] = field(default_factory=dict)

    def home(self, name: str) -> Path:
        """A learner's home: their system account's, or the hub's folder when not root."""
        return Path(pwd.getpwnam(name).pw_dir) if self.system_users else self.state / "home" / name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _hubctl(room_state: Path, group: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(HUB_PYTHON), str(HUBCTL), "--state", str(room_state), "--group", group, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)


def _learner_processes(room: Room) -> list[str]:
    """Live processes run by the room's learners, or carrying its state folder in their
    environment. A zombie is not counted: it has ended, and only its parent's reaping is left
    (an orphan's parent is PID 1, which in a container may never reap)."""
    uids = {pwd.getpwnam(n).pw_uid for n in room.learners if account_exists(n)}
    marker = f"LABKIT_HUB_STATE={room.state}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if proc.stat().st_uid in uids or marker in (proc / "environ").read_bytes():
                found.append(f"{proc.name}: {(proc / 'cmdline').read_bytes()[:120]!r}")
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def room(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Room]:
    """`make hub`'s room, CPU mode, on a free port; stopped and its learners removed after."""
    # As root, learners are system users, unless they could not reach the kit (a clone in a
    # private home): then, as when not root, every server runs as this user.
    system_users = os.geteuid() == 0 and load("build_env").learner_problem(HUB_PYTHON) is None
    tag = secrets.token_hex(3)
    state = tmp_path_factory.mktemp("room") / "state"
    group = f"lkt{tag}"
    port = _free_port()
    start = time.perf_counter()
    args = ["start", "--port", str(port), "--gpus", "none", "--admin", f"ins{tag}"]
    done = _hubctl(state, group, *args, *([] if system_users else ["--same-user"]))
    started = time.perf_counter() - start
    assert done.returncode == 0, done.stdout + done.stderr
    admin, password = (state / "passwords.txt").read_text().split()
    room = Room(
        f"http://127.0.0.1:{port}",
        state,
        group,
        admin,
        password,
        [f"lkt{tag}{i}" for i in (1, 2, 3)],
        system_users,
        {"hub start": started},
    )
    try:
        yield room
    finally:
        _hubctl(state, group, "stop")
        if system_users:
            for name in [*room.learners, admin]:
                if account_exists(name):
                    subprocess.run(["userdel", "--remove", name], capture_output=True, check=False)
            subprocess.run(["groupdel", group], capture_output=True, check=False)
        print(f"room timings (s): {json.dumps({k: round(v, 1) for k, v in room.times.items()})}")


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One headless Chromium for the module: a context (cookie jar) per person."""
    with browser() as b:
        yield b


def _login(page: Any, room: Room, name: str, password: str) -> None:
    page.goto(f"{room.url}/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", password)
    page.click("#login_submit")


@pytest.fixture(scope="module")
def learners(room: Room, chromium: Any) -> dict[str, Any]:
    """Three learners signed up, approved by the instructor, and logged in at the same time."""
    pages = {}
    for name in room.learners:
        page = chromium.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        page.set_default_timeout(180_000)
        page.goto(f"{room.url}/hub/signup")
        page.fill("#username_input", name)
        page.fill("#password_input", PASSWORD)
        page.fill("#password_confirmation_input", PASSWORD)
        page.click("#signup_submit")
        assert "sent to the admin" in page.locator(".alert").inner_text()
        pages[name] = page
    waiting = pages[room.learners[0]]
    _login(waiting, room, room.learners[0], PASSWORD)
    # The click starts a navigation: wait for the page it leads to, not the one it leaves.
    waiting.get_by_text("has not been authorized").wait_for(timeout=120_000)
    instructor = chromium.new_context().new_page()
    _login(instructor, room, room.admin, room.admin_password)
    instructor.wait_for_url("**/hub/authorize")  # the instructor lands on the approvals
    for name in room.learners:
        row = instructor.locator("tr", has_text=name)
        row.locator("a", has_text="Authorize").click()
        row.locator("a", has_text="Unauthorize").wait_for()  # the reloaded page's row
    table = instructor.locator("table").inner_text()
    assert all(re.search(rf"{n}\s+False\s+Yes", table) for n in room.learners), table
    instructor.context.close()
    start = time.perf_counter()
    for name, page in pages.items():  # all three log in before any server is up
        _login(page, room, name, PASSWORD)
    for name, page in pages.items():
        page.wait_for_url(f"**/user/{name}/lab**", timeout=300_000)
    room.times["3 logins to 3 labs"] = time.perf_counter() - start
    for name in room.learners:  # the kernel check with every cell in the page, as test_browser
        home, work = room.home(name), room.home(name) / progress.WORK_DIR
        kernel_check_notebook(work / CHECK)
        fresh_lab([work / CHECK], home / ".jupyter" / "lab" / "user-settings")
        if room.system_users:
            user = pwd.getpwnam(name)
            subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(home)], check=True)
    return pages


def test_three_learners_run_a_notebook_at_once_each_in_their_own_server(
    room: Room, learners: dict[str, Any]
) -> None:
    logs = {name: PageLog(page) for name, page in learners.items()}
    start = time.perf_counter()
    for name, page in learners.items():
        start_run_all(page, f"{room.url}/user/{name}/lab/tree/{CHECK}?reset")
    for name, page in learners.items():
        try:
            wait_run_all_passed(page, RUN_ALL_TIMEOUT_MS)
        except Exception:
            print(f"{name}: Run All did not pass")
            OUT.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(OUT / f"hub-failed-{name}.png"))
            log = (room.state / "jupyterhub.log").read_text().splitlines()
            print("\n".join(line for line in log[-60:] if "ConfigProxy" not in line))
            raise
    room.times["3 kernel checks at once"] = time.perf_counter() - start
    for name, page in learners.items():
        outputs = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
        assert "num_devices" in outputs and "backend" in outputs, name
        assert "✓ the sum compiled for 8 H100s all-reduces" in outputs, name
        assert page.locator(".jp-OutputArea-output img").count() >= 1, f"{name}: no plot"
        assert "[00.1] to do" in outputs, f"{name}: the exercise checker did not run"
        off_server = logs[name].outside(room.url, "data:", "blob:")
        assert not off_server, f"{name}: requests off the server: {off_server}"
    OUT.mkdir(parents=True, exist_ok=True)
    learners[room.learners[0]].screenshot(path=str(OUT / "hub-kernel_check.png"))


def test_each_learner_has_only_their_own_server_and_files(
    room: Room, learners: dict[str, Any]
) -> None:
    alice, bob = room.learners[:2]
    page = learners[alice]
    for path in (f"/user/{bob}/api/contents", f"/user/{bob}/api/kernels"):
        status = page.request.get(f"{room.url}{path}", max_redirects=0).status
        assert status in (302, 403, 404), f"{alice} got {status} for {path}"
    assert page.request.get(f"{room.url}/hub/api/users/{bob}").status in (403, 404)
    assert page.request.get(f"{room.url}/user/{alice}/api/contents").status == 200
    response = page.goto(f"{room.url}/user/{bob}/lab")
    assert response.status == 403 or f"/user/{alice}/" in page.url, (response.status, page.url)
    if (
        room.system_users
    ):  # the OS keeps them apart too: private homes, files owned by their learner
        bob_user = pwd.getpwnam(bob)
        assert bob_user.pw_name in grp.getgrnam(room.group).gr_mem
        assert (Path(bob_user.pw_dir).stat().st_mode & 0o777) == 0o700
        notebook = Path(bob_user.pw_dir) / progress.WORK_DIR / "00_welcome.ipynb"
        assert notebook.stat().st_uid == bob_user.pw_uid
        assert unreadable_by(notebook, pwd.getpwnam(alice))


def test_a_wrong_password_is_refused(room: Room, chromium: Any) -> None:
    page = chromium.new_context().new_page()
    _login(page, room, room.learners[2], PASSWORD + "x")
    # The click starts a navigation: wait for the page it leads to, not the one it leaves.
    page.get_by_text("Invalid username or password").wait_for(timeout=120_000)
    assert "/hub/login" in page.url
    assert page.request.get(f"{room.url}/hub/api/user").status == 403
    page.context.close()


def test_the_room_table_shows_the_three(room: Room, learners: dict[str, Any]) -> None:
    args = ["--group", room.group] if room.system_users else [str(room.state / "home")]
    done = subprocess.run(
        [sys.executable, "-m", "labkit", "room", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = {line.split("|")[1].strip(): line for line in done.stdout.splitlines()[2:]}
    assert set(room.learners) <= set(rows), done.stdout
    assert done.stdout.splitlines()[0] == "| learner | 00.1 | 00.2 | passed |"
    for name in room.learners:
        assert rows[name] == f"| {name} | · | · | 0/2 |"
        path = room.home(name) / progress.WORK_DIR / progress.FILE_NAME
        owner = pwd.getpwnam(name).pw_uid if room.system_users else os.geteuid()
        assert path.stat().st_uid == owner


def test_stopping_the_room_leaves_no_process(room: Room, chromium: Any) -> None:
    assert _learner_processes(room), "the learners' servers should be running before the stop"
    start = time.perf_counter()
    done = _hubctl(room.state, room.group, "stop")
    room.times["hub stop"] = time.perf_counter() - start
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no process of it is left" in done.stdout
    assert _learner_processes(room) == []
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", int(room.url.rsplit(":", 1)[1]))) != 0
