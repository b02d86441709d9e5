"""JupyterHub configuration of the room (`make hub`); tools/hub/hubctl.py passes the settings.

Every setting comes from an environment variable that hubctl.py sets from its options
(``make hub HUB_PORT=...``); the rules (accounts, folders, GPUs) are in labhub.py.
"""

# ruff: noqa: F821  (get_config is provided by JupyterHub's config loader)

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import bcrypt
import nativeauthenticator
from nativeauthenticator import NativeAuthenticator
from nativeauthenticator import handlers as native_handlers
from nativeauthenticator.orm import UserInfo

sys.path.insert(0, str(Path(__file__).resolve().parent))
import labhub

from labkit.core.progress import WORK_DIR

c = get_config()
setting = os.environ.get

STATE = Path(setting("LABKIT_HUB_STATE", labhub.KIT / "build" / "hub")).resolve()
HUB_ENV = Path(sys.prefix)
KIT_ENV = Path(setting("LABKIT_HUB_KIT_ENV", labhub.KIT / ".venv"))
ADMIN = setting("LABKIT_HUB_ADMIN", "instructor")
ACCOUNTS = setting("LABKIT_HUB_ACCOUNTS", "")
GROUP = setting("LABKIT_HUB_GROUP", labhub.LEARNERS_GROUP)
# Learners as system users: as root, unless hubctl was told --same-user.
SYSTEM_USERS = os.geteuid() == 0 and setting("LABKIT_HUB_SYSTEM_USERS", "1") == "1"
GPUS = labhub.GpuRoundRobin(labhub.parse_gpus(setting("LABKIT_HUB_GPUS", "none")))
FRACTION = labhub.memory_fraction(int(setting("LABKIT_HUB_LEARNERS_PER_GPU", "4")))

# --- The hub, its proxy and its secrets (files of mode 0600 in STATE, made by hubctl) ---
c.JupyterHub.bind_url = (
    f"http://{setting('LABKIT_HUB_IP', '127.0.0.1')}:{setting('LABKIT_HUB_PORT', '8000')}"
)
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{setting('LABKIT_HUB_API_PORT', '8081')}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.pid_file = str(STATE / "jupyterhub.pid")
c.ConfigurableHTTPProxy.command = [str(HUB_ENV / "proxy/node_modules/.bin/configurable-http-proxy")]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{setting('LABKIT_HUB_PROXY_API_PORT', '8001')}"
c.ConfigurableHTTPProxy.auth_token = (STATE / "proxy_token").read_text().strip()
c.ConfigurableHTTPProxy.pid_file = str(STATE / "proxy.pid")
c.JupyterHub.cleanup_servers = True  # stopping the hub stops every learner's server

# --- Accounts: sign-up + the instructor's approval, or pre-created from a list ---


class _NoStats:
    """A do-nothing timer: JupyterHub 6 removed ``statsd``, NativeAuthenticator 1.3.0's
    login handler still times logins with it (without this every login is a 500)."""

    def timer(self, _name: str) -> _NoStats:
        return self

    def start(self) -> _NoStats:
        return self

    def stop(self, send: bool = True) -> None:
        return None


class LoginHandler(native_handlers.LoginHandler):
    """NativeAuthenticator's login page with the missing ``statsd``."""

    statsd = _NoStats()


class RoomAuthenticator(NativeAuthenticator):
    """NativeAuthenticator that creates the instructor's account and the listed learners.

    Each account made here gets a random password, appended to STATE/passwords.txt (mode
    0600) for the instructor to hand out; nothing is printed. The admin account exists
    before the hub opens, so nobody can sign up under the admin's name first.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        names = [ADMIN] + (labhub.read_accounts(Path(ACCOUNTS)) if ACCOUNTS else [])
        new = [n for n in dict.fromkeys(names) if not self.user_exists(n)]
        if not new:
            return
        passwords = STATE / "passwords.txt"
        fd = os.open(passwords, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as f:
            for name in new:
                password = labhub.new_password()
                digest = bcrypt.hashpw(password.encode(), bcrypt.gensalt())
                self.db.add(UserInfo(username=name, password=digest, is_authorized=True))
                f.write(f"{name} {password}\n")
        self.db.commit()
        self.log.info("created %d account(s); passwords in %s", len(new), passwords)

    def get_handlers(self, app: Any) -> list[tuple[str, Any]]:
        """NativeAuthenticator's pages, with the login page that works on JupyterHub 6."""
        return [
            (path, LoginHandler if handler is native_handlers.LoginHandler else handler)
            for path, handler in super().get_handlers(app)
        ]


def landing(handler: Any) -> str:
    """Where a login lands: the instructor on the approvals page, a learner in their lab."""
    user = handler.current_user
    return "/hub/authorize" if user is not None and user.admin else ""


c.JupyterHub.authenticator_class = RoomAuthenticator
c.JupyterHub.default_url = landing
c.JupyterHub.template_paths = [str(Path(nativeauthenticator.__file__).parent / "templates")]
c.Authenticator.admin_users = {ADMIN}
c.Authenticator.allow_all = True  # who may log in is NativeAuthenticator's approval
c.Authenticator.username_pattern = labhub.USERNAME_PATTERN
c.NativeAuthenticator.enable_signup = setting("LABKIT_HUB_SIGNUP", "1") == "1"
c.NativeAuthenticator.minimum_password_length = 10
c.NativeAuthenticator.check_common_password = True
c.NativeAuthenticator.allowed_failed_logins = 3
c.NativeAuthenticator.seconds_before_next_try = 60

# --- Learners' servers: the kit's JupyterLab and kernel, each in their own folder ---
if SYSTEM_USERS:
    c.JupyterHub.spawner_class = "jupyterhub.spawner.LocalProcessSpawner"
else:  # one user runs everything: no separation by the OS (hubctl says so at start)
    c.JupyterHub.spawner_class = "jupyterhub.spawner.SimpleLocalProcessSpawner"
    c.SimpleLocalProcessSpawner.home_dir_template = str(STATE / "home" / "{username}")
    if os.geteuid() == 0:
        c.Spawner.args = ["--allow-root"]
c.Spawner.cmd = [str(HUB_ENV / "bin" / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.http_timeout = 120  # a busy machine: a learner's server took 7.5-10 s alone
c.Spawner.start_timeout = 180


def pre_spawn(spawner: Any) -> None:
    """Before a learner's server starts: their account, their copy of the lessons, a GPU."""
    name = spawner.user.name
    if SYSTEM_USERS:
        user = labhub.ensure_learner(name, GROUP)
        home, owner = Path(user.pw_dir), (user.pw_uid, user.pw_gid)
    else:
        home, owner = STATE / "home" / name, None
    work = home / WORK_DIR
    labhub.copy_lessons(work, owner)
    spawner.notebook_dir = str(work)
    env = labhub.learner_environment(work, KIT_ENV, HUB_ENV)
    device = GPUS.device_for(name)
    if device is not None:
        env.update(labhub.gpu_environment(device, FRACTION))
    env["LABKIT_HUB_STATE"] = str(STATE)  # hubctl stop finds anything left by it
    spawner.environment.update(env)


c.Spawner.pre_spawn_hook = pre_spawn

# --- Idle servers are stopped ---
c.JupyterHub.services = [
    {
        "name": "idle-culler",
        "command": [
            sys.executable,
            "-m",
            "jupyterhub_idle_culler",
            f"--timeout={setting('LABKIT_HUB_IDLE_TIMEOUT', '3600')}",
        ],
        "environment": {"LABKIT_HUB_STATE": str(STATE)},
    }
]
c.JupyterHub.load_roles = [
    {
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    }
]

# --- More config files, loaded last (hubctl --extra-config): the SLURM recipe, a site's values
for extra in filter(None, setting("LABKIT_HUB_EXTRA_CONFIG", "").split(os.pathsep)):
    load_subconfig(extra)
