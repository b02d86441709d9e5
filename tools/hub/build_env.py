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
When TARGET itself lies in a folder other users cannot enter (a clone in a private home,
or under ``mktemp -d``), nothing there can serve them: the build goes on for the tests and
same-user trials, which need no other user, and says so in one line; ``make hub`` then
names the folder and the ways out.

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
import stat
import struct
import subprocess
import sys
import sysconfig
import time
import tomllib
from collections.abc import Iterable
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


def private_folders(paths: Iterable[Path]) -> list[Path]:
    """Folders on the way to ``paths`` (each one included) that other users cannot pass.

    A folder without the execute bit for others (mode 0700, 0750) keeps every user but its
    owner and group out of all below it. Each path is walked as written and resolved, top
    first; folders that do not exist yet are skipped.
    """
    found: list[Path] = []
    for path in paths:
        written = Path(os.path.abspath(path))
        for form in (written, written.resolve()):
            for folder in [*reversed(form.parents), form]:
                try:
                    mode = folder.stat().st_mode
                except OSError:
                    continue
                if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH and folder not in found:
                    found.append(folder)
    return found


def describe(folder: Path) -> str:
    """``folder (mode 0700, owner root)``: what a message about a private folder names."""
    info = folder.stat()
    try:
        owner = pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        owner = str(info.st_uid)
    return f"{folder} (mode {stat.S_IMODE(info.st_mode):04o}, owner {owner})"


def private_note(blocking: list[Path]) -> str:
    """One line for `make setup-hub` in a private folder: what it built, and why that way."""
    more = f" and {len(blocking) - 1} folder(s) below it" if len(blocking) > 1 else ""
    return (
        f"note: {describe(blocking[0])}{more} lets no other user in, so learners could not "
        "run this .venv-hub: it is built for the tests and same-user trials, which need no "
        "other user (`make test` runs the room with --same-user); `make hub` says how to "
        "make a room of system users here."
    )


def learner_problem(python: Path, kit_env: Path | None = None, kit: Path = KIT) -> str | None:
    """Why learners (other system users) cannot use the room's environment, or None.

    Always None when not root: then every learner's server runs as this user. When a folder
    keeps them out (see private_folders), the message names it and the ways out.
    """
    if os.geteuid() != 0:
        return None
    check = "import jupyterhub, nativeauthenticator, jupyterlab, jax, labkit"
    done = as_learner([str(python), "-c", check])
    if done.returncode == 0:
        return None
    blocking = private_folders([python, kit, *([kit_env] if kit_env else [])])
    if blocking:
        names = ", ".join(describe(folder) for folder in blocking)
        return (
            f"{names} {'lets' if len(blocking) == 1 else 'let'} no other user in, so the "
            f"learners (each a system user of the room) cannot run {python} nor read the "
            f"kit at {kit}. Ways out:\n"
            "  - clone the kit again where other users can enter, e.g. /opt/openxla-lab or "
            "/srv/openxla-lab, and run `make hub` there (a moved clone's environments keep "
            "their old paths);\n"
            f"  - let other users through: `chmod o+x {' '.join(map(str, blocking))}` (they "
            "can pass through, not list what is there);\n"
            "  - a trial, every learner's server run as root: `make hub HUB_ARGS=--same-user`."
        )
    return (
        f"other users cannot use {python} ({done.stderr.strip().splitlines()[-1:]}): the "
        f"kit's folder {kit} and its environment must be readable by them. Clone the kit "
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


def room_python(target: Path, base: Path = Path(sys.base_prefix)) -> tuple[Path, str | None]:
    """The interpreter to make the room's venv from, and a one-line note or None.

    The base Python at ``base`` when learners can run it, else a copy in ``target/python``
    that must start as another user. As root with ``target`` in a folder other users cannot
    enter, no place there can serve them: the copy must start as this user (tests and
    same-user trials), and the note says what was adapted and why.
    """
    blocking = private_folders([target, KIT]) if os.geteuid() == 0 else []
    python = base / "bin" / VERSION
    if learners_can_run(python):
        return python, private_note(blocking) if blocking else None
    python = copy_python(base, target / "python")
    if blocking:
        done = subprocess.run(
            [str(python), "-c", "import ssl, sqlite3"], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise BuildError(
                f"the copy of Python in {target / 'python'} does not start: "
                f"{done.stderr.strip()[-1000:]}"
            )
        return python, private_note(blocking)
    if not learners_can_run(python):
        raise BuildError(
            f"the copy of Python in {target / 'python'} does not start as another user: "
            f"{as_learner([str(python), '-c', 'pass']).stderr.strip()}"
        )
    return python, None


def run(cmd: list[str], what: str) -> None:
    """Run a build step; on failure raise BuildError with its output."""
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip().splitlines()[-20:]
        raise BuildError(f"{what} failed ({' '.join(cmd[:4])} ...):\n" + "\n".join(output))


def build(target: Path) -> dict[str, object]:
    """Build the room's environment at ``target``; return what it chose and measured."""
    start = time.perf_counter()
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    base_python, note = room_python(target)
    copied = base_python.is_relative_to(target)
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
    if note is not None:  # a private folder: said once, in one line
        print(note, file=sys.stderr)
    elif problem := learner_problem(python, Path(sys.prefix)):
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
