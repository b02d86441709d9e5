"""The room's rules, as plain functions: learners' accounts and folders, GPUs, secrets.

jupyterhub_config.py wires these into JupyterHub; they import nothing from JupyterHub, so
the kit's tests check them directly. Run as root, each learner is a system user of the
group LEARNERS_GROUP with a private home (mode 0700); the hub refuses to start a server for
a name that belongs to a system account it did not create (root, a service, the instructor).
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from labkit.core.progress import ENV_VAR, FILE_NAME, LEARNERS_GROUP

KIT = Path(__file__).resolve().parents[2]
LESSONS = KIT / "notebooks"
# Hub names become system user names: lower case, a letter first, at most 32 characters.
USERNAME_PATTERN = r"^[a-z][a-z0-9_-]{0,31}$"
# Copied to learners: the lessons, their paired .md files (hidden in JupyterLab), figures,
# solutions. Never copied: checkpoints and executed copies.
NOT_COPIED = (".ipynb_checkpoints", "__pycache__", "*.executed.ipynb")


class RoomError(RuntimeError):
    """A learner's server cannot start; the message says why and what to do."""


def check_username(name: str) -> None:
    """Raise RoomError unless ``name`` can be a learner's system user name."""
    if not re.fullmatch(USERNAME_PATTERN, name):
        raise RoomError(
            f"user name {name!r} is not allowed: use lower-case letters, digits, '-' or '_', "
            "starting with a letter, at most 32 characters"
        )


def write_secret(path: Path, nbytes: int = 32) -> bool:
    """Create ``path`` holding a random hex secret, mode 0600; False if it already exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        os.chmod(path, 0o600)
        return False
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(nbytes) + "\n")
    return True


def new_password() -> str:
    """A random password for a pre-created account (about 96 bits)."""
    return secrets.token_urlsafe(12)


def read_accounts(path: Path) -> list[str]:
    """User names from a file, one a line (``#`` comments and blank lines skipped)."""
    names = []
    for raw in path.read_text().splitlines():
        name = raw.split("#", 1)[0].strip()
        if name:
            check_username(name)
            names.append(name)
    return list(dict.fromkeys(names))


def ensure_group(group: str) -> int:
    """The gid of ``group``, created as a system group if missing (root only)."""
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        subprocess.run(["groupadd", "--system", group], check=True, capture_output=True)
        return grp.getgrnam(group).gr_gid


def in_group(user: pwd.struct_passwd, group: str) -> bool:
    """True when ``user`` is a member of ``group`` (primary or supplementary)."""
    try:
        entry = grp.getgrnam(group)
    except KeyError:
        return False
    return user.pw_gid == entry.gr_gid or user.pw_name in entry.gr_mem


def ensure_learner(name: str, group: str = LEARNERS_GROUP) -> pwd.struct_passwd:
    """The system user of learner ``name``, created on first use with a private home.

    An existing account is used only if the hub made it (a member of ``group``): a hub user
    named ``root`` or after the instructor's own account never runs as that account.
    """
    check_username(name)
    try:
        user = pwd.getpwnam(name)
    except KeyError:
        ensure_group(group)
        cmd = ["useradd", "--create-home", "-K", "HOME_MODE=0700", "--shell", "/bin/bash"]
        cmd += ["--groups", group, "--comment", "OpenXLA lab learner", name]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RoomError(f"useradd {name} failed: {done.stderr.strip()}") from None
        return pwd.getpwnam(name)
    if not in_group(user, group):
        raise RoomError(
            f"{name!r} is an existing system account that the hub did not create (it is not "
            f"in group {group}); its server will not start. Sign up with another name."
        )
    return user


def copy_lessons(
    work: Path, owner: tuple[int, int] | None = None, source: Path = LESSONS
) -> list[Path]:
    """Copy each lesson file missing from ``work``; never overwrite. Returns the new files.

    A learner's edits stay theirs; a file they delete comes back fresh on the next start
    (their way to reset a lesson). Each copied .md is made newer than its notebook, as in
    the repository: jupytext pairs them and refuses a notebook newer than its text file.
    """
    ignore = shutil.ignore_patterns(*NOT_COPIED)
    made: list[Path] = []
    if not work.exists():
        work.mkdir(mode=0o755, parents=True)
        made.append(work)
    for src in sorted(source.rglob("*")):
        rel = src.relative_to(source)
        if any(ignore(str(src.parent), [part]) for part in rel.parts):
            continue
        dst = work / rel
        if dst.exists() or dst.is_symlink():
            continue
        if src.is_dir():
            dst.mkdir(mode=0o755)
        else:
            shutil.copyfile(src, dst)
        made.append(dst)
    for path in made:
        if path.suffix == ".md" and path.with_suffix(".ipynb").exists():
            os.utime(path)
    if owner is not None:
        for path in made:
            os.chown(path, *owner)
    return made


def parse_gpus(text: str) -> list[str]:
    """GPU ids from a comma list ("0,1", MIG UUIDs); "none" or "" means CPU mode."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    return [] if items in ([], ["none"]) else items


def detect_gpus(nvidia_smi_l: str | None = None) -> list[str]:
    """What to hand out, from ``nvidia-smi -L``: each MIG slice's UUID, else each GPU's index.

    A GPU split into MIG slices is handed out slice by slice; a whole GPU by index.
    """
    if nvidia_smi_l is None:
        try:
            nvidia_smi_l = subprocess.run(
                ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return []
    devices: list[str] = []
    for line in nvidia_smi_l.splitlines():
        gpu = re.match(r"GPU (\d+):", line)
        mig = re.search(r"\bMIG .*\(UUID: (MIG-[^)\s]+)\)", line)
        if gpu:
            devices.append(gpu.group(1))
        elif mig and devices:
            if not devices[-1].startswith("MIG-"):
                devices.pop()  # the GPU is split: hand out its slices instead
            devices.append(mig.group(1))
    return devices


def memory_fraction(learners_per_gpu: int, reserve: float = 0.1) -> float:
    """Each learner's share of a GPU's memory: (1 - reserve) / learners, two decimals down.

    ``reserve`` stays free for what no fraction counts: every process's CUDA context and
    library workspaces.
    """
    if learners_per_gpu < 1:
        raise ValueError(f"learners_per_gpu must be >= 1, got {learners_per_gpu}")
    return int((1 - reserve) / learners_per_gpu * 100) / 100


def gpu_environment(device: str, fraction: float) -> dict[str, str]:
    """Environment for a learner on GPU (or MIG slice) ``device`` with a memory share.

    From the JAX documentation, "GPU memory allocation": no preallocation (a kernel takes
    memory as it needs it, so idle kernels hold none) and XLA_CLIENT_MEM_FRACTION (the
    jaxlib 0.12 name; XLA_PYTHON_CLIENT_MEM_FRACTION is deprecated and setting both raises)
    as each kernel's limit.
    """
    return {
        "CUDA_VISIBLE_DEVICES": device,
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "XLA_CLIENT_MEM_FRACTION": f"{fraction:.2f}",
    }


class GpuRoundRobin:
    """Hands each new learner the next GPU of a list; a learner keeps theirs."""

    def __init__(self, devices: Iterable[str]) -> None:
        self.devices = list(devices)
        self.assigned: dict[str, str] = {}

    def device_for(self, learner: str) -> str | None:
        """The learner's GPU (None in CPU mode)."""
        if not self.devices:
            return None
        if learner not in self.assigned:
            self.assigned[learner] = self.devices[len(self.assigned) % len(self.devices)]
        return self.assigned[learner]


def learner_environment(
    work: Path, kit_env: Path, hub_env: Path, kit: Path = KIT
) -> dict[str, str]:
    """Environment of a learner's server: the kit's Jupyter files and progress recording.

    The server runs from the hub's environment, which reaches the kit's packages through a
    .pth file; JupyterLab's assets, extensions and server settings stay the kit's own.
    LABKIT_PROGRESS makes each exercise checker record its verdict in ``work``.
    """
    return {
        "PATH": f"{hub_env / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "JUPYTER_PATH": f"{hub_env / 'share' / 'jupyter'}:{kit_env / 'share' / 'jupyter'}",
        "JUPYTER_CONFIG_PATH": f"{kit / 'tools'}:{kit_env / 'etc' / 'jupyter'}",
        "JUPYTERLAB_DIR": str(kit_env / "share" / "jupyter" / "lab"),
        ENV_VAR: str(work / FILE_NAME),
    }
