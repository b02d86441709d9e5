"""Build .venv-hub: JupyterHub for a room, on the kit's own environment.

Usage: ENV_PYTHON tools/hub/build_env.py [TARGET]   (`make setup-hub`; TARGET: .venv-hub)

Run with the kit's Python (.venv or the active conda environment). TARGET becomes a venv
that holds only what the room adds (JupyterHub, its authenticator, the idle culler,
batchspawner for the SLURM recipe's check) and reaches every package of the kit's
environment through one ``.pth`` file: the learners' JupyterLab and kernels import jax,
labkit and JupyterLab from the kit's environment itself, not from a second copy. The room's
packages are installed with ``-c constraints.txt``, so none of them can shadow a kit package
with another version.

Learners' servers run as their own system users, so they must be able to execute the
interpreter. When the kit's base Python is not executable by other users (pyenv under
/root, mode 0700), a copy of it goes into TARGET/python (standard library only, about
60 MB) with its library path made relative (``$ORIGIN/../lib``); /root stays as it is.

configurable-http-proxy comes from npm, pinned with its dependencies by
tools/hub/package-lock.json (``npm ci``).
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import site
import struct
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path

KIT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PTH = "labkit-env.pth"
VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"
# Not needed to run a learner's lab: tests, IDLE, Tk, the static library and headers.
SKIP = {"test", "idlelib", "tkinter", "turtledemo", "site-packages", "__pycache__", "include"}


class BuildError(RuntimeError):
    """The room's environment cannot be built here; the message says why and what to do."""


def hub_requirements(pyproject: Path = KIT / "pyproject.toml") -> list[str]:
    """The ``hub`` extra of pyproject.toml: the room's pinned packages."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return list(project["optional-dependencies"]["hub"])


def as_learner(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` as user nobody (root only): what a learner's server could run."""
    nobody = pwd.getpwnam("nobody")
    try:
        return subprocess.run(
            cmd,
            user=nobody.pw_uid,
            group=nobody.pw_gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
            check=False,
        )
    except OSError as exc:  # the exec itself failed: no permission to run it
        return subprocess.CompletedProcess(cmd, 126, "", str(exc))


def learners_can_run(python: Path) -> bool:
    """True when other users can start ``python`` (always, when not root: no other users)."""
    if os.geteuid() != 0:
        return True
    return as_learner([str(python), "-c", "import ssl, sqlite3"]).returncode == 0


def learner_problem(python: Path) -> str | None:
    """Why learners (other system users) cannot use the room's environment, or None.

    Always None when not root: then every learner's server runs as this user.
    """
    if os.geteuid() != 0:
        return None
    check = "import jupyterhub, nativeauthenticator, jupyterlab, jax, labkit"
    done = as_learner([str(python), "-c", check])
    if done.returncode == 0:
        return None
    return (
        f"other users cannot use {python} ({done.stderr.strip().splitlines()[-1:]}): the "
        f"kit's folder {KIT} and its environment must be readable by them. Clone the kit "
        "outside private homes (under /opt or /srv); until then `make hub` runs every "
        "learner's server as root only with HUB_ARGS=--same-user (a trial, not a room)."
    )


def set_runpath(binary: Path, runpath: str) -> str:
    """Rewrite an ELF file's DT_RUNPATH (or DT_RPATH) in place; return the old value.

    The new path must not be longer than the old one (as chrpath): it overwrites the string
    in the dynamic string table and pads with NUL bytes.
    """
    data = bytearray(binary.read_bytes())
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise BuildError(f"{binary} is not a 64-bit little-endian ELF file")
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        kind, _, offset, vaddr, _, filesz, _, _ = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + i * phentsize
        )
        if kind == 1:  # PT_LOAD
            loads.append((vaddr, offset, filesz))
        elif kind == 2:  # PT_DYNAMIC
            dynamic = (offset, filesz)
    if dynamic is None:
        raise BuildError(f"{binary} has no dynamic section")
    tags = {}
    for pos in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", data, pos)
        if tag == 0:  # DT_NULL
            break
        tags[tag] = value
    key = 29 if 29 in tags else 15  # DT_RUNPATH, else DT_RPATH
    if key not in tags:
        raise BuildError(f"{binary} has no RUNPATH or RPATH to rewrite")
    strtab = next(
        off + tags[5] - vaddr for vaddr, off, size in loads if vaddr <= tags[5] < vaddr + size
    )
    start = strtab + tags[key]
    end = data.index(b"\0", start)
    old, new = bytes(data[start:end]), runpath.encode()
    if len(new) > len(old):
        raise BuildError(f"{binary}: RUNPATH {runpath!r} is longer than {old.decode()!r}")
    data[start:end] = new + b"\0" * (len(old) - len(new))
    binary.write_bytes(data)
    return old.decode()


def copy_python(base: Path, target: Path) -> Path:
    """Copy the interpreter at prefix ``base`` to ``target`` (stdlib only); return its python."""
    shutil.copytree(
        base,
        target,
        symlinks=True,
        ignore=lambda _dir, names: [n for n in names if n in SKIP or n.startswith("config-3")],
    )
    python = target / "bin" / VERSION
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        set_runpath(python, "$ORIGIN/../lib")  # libpython3.x.so next to it, not in base
    return python


def run(cmd: list[str], what: str) -> None:
    """Run a build step; on failure raise BuildError with its output."""
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip().splitlines()[-20:]
        raise BuildError(f"{what} failed ({' '.join(cmd[:4])} ...):\n" + "\n".join(output))


def build(target: Path) -> dict[str, object]:
    """Build the room's environment at ``target``; return what it chose and measured."""
    start = time.perf_counter()
    base = Path(sys.base_prefix)
    base_python = base / "bin" / VERSION
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    copied = not learners_can_run(base_python)
    if copied:
        base_python = copy_python(base, target / "python")
        if not learners_can_run(base_python):
            raise BuildError(
                f"the copy of Python in {target / 'python'} does not start as another user: "
                f"{as_learner([str(base_python), '-c', 'pass']).stderr.strip()}"
            )
    run([str(base_python), "-m", "venv", "--without-pip", str(target)], "creating the venv")
    python = target / "bin" / "python"
    purelib = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    kit_sites = [p for p in site.getsitepackages() if Path(p).is_dir()]
    lines = [f"import site; site.addsitedir({p!r})" for p in kit_sites]
    (purelib / PTH).write_text("\n".join(lines) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
    pip += ["--disable-pip-version-check", "-c", str(KIT / "constraints.txt")]
    pip += ["-c", str(KIT / "constraints-hub.txt"), *hub_requirements()]
    run(pip, "installing the hub's packages")
    proxy = target / "proxy"
    proxy.mkdir()
    for name in ("package.json", "package-lock.json"):
        shutil.copy(HERE / name, proxy / name)
    if shutil.which("npm") is None:
        raise BuildError(
            "npm was not found: the hub's proxy (configurable-http-proxy) comes from npm. "
            "Install Node.js >= 20 with npm (Debian/Ubuntu: apt-get install nodejs npm)."
        )
    npm = ["npm", "ci", "--prefix", str(proxy), "--no-audit", "--no-fund", "--loglevel=error"]
    run(npm, "installing configurable-http-proxy")
    run([str(python), str(KIT / "tools" / "kernel-spec"), str(target)], "writing the kernel spec")
    if problem := learner_problem(python):
        print(f"warning: {problem}", file=sys.stderr)
    size = subprocess.check_output(["du", "-sm", str(target)], text=True).split()[0]
    return {
        "target": str(target),
        "python": "copied" if copied else str(base_python),
        "size_mb": int(size),
        "seconds": round(time.perf_counter() - start, 1),
    }


def main(argv: list[str]) -> int:
    """Build the environment; print one line of what was built."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", nargs="?", default=str(KIT / ".venv-hub"))
    args = parser.parse_args(argv)
    try:
        result = build(Path(args.target).resolve())
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"room environment ready: {json.dumps(result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
