"""Process-wide setup before JAX starts, and the environment report.

Every notebook's first cell calls :func:`setup`. JAX reads the device count, the platform
list and ``XLA_FLAGS`` once, when its backend starts; changing them later silently does
nothing, so ``setup`` refuses to run late instead of pretending.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import functools
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

Mode = Literal["cpu", "gpu"]

_RESTART_HINT = (
    "restart the kernel (Kernel > Restart Kernel) or the Python process and call "
    "labkit.core.env.setup(...) first, before any other JAX work"
)


class SetupError(RuntimeError):
    """The environment cannot be set up as asked; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class Setup:
    """What :func:`setup` chose: the mode, the device count and the XLA flags in force."""

    mode: Mode
    num_devices: int
    xla_flags: tuple[str, ...]


_current: Setup | None = None


def nvidia_gpu_present() -> bool:
    """True when this machine has an NVIDIA GPU driver with at least one device."""
    if Path("/proc/driver/nvidia/gpus").is_dir() and any(
        Path("/proc/driver/nvidia/gpus").iterdir()
    ):
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def backend_started() -> bool:
    """True once JAX has created its backends (device count and XLA_FLAGS are then fixed)."""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


_DASHES = "\u2010\u2011\u2012\u2013\u2014\u2015\u2212"  # what web pages make of "--"


def _merge_xla_flags(existing: str, extra: Sequence[str]) -> str:
    """Merge ``--name=value`` flags into an XLA_FLAGS string; later names win."""
    merged: dict[str, str] = {}
    for token in [*existing.split(), *extra]:
        if token[:1] in _DASHES:
            raise SetupError(
                f"XLA flag {token!r} starts with {token[0]!r} (U+{ord(token[0]):04X}), not two "
                "ASCII hyphens: web pages turn '--' into a dash. Type --name=value."
            )
        if not token.startswith("--"):
            raise SetupError(f"XLA flag {token!r} must look like --name=value")
        name = token[2:].split("=", 1)[0]
        merged[name] = token
    return " ".join(merged.values())


def _jax_gpu_devices() -> list[object]:
    """The GPUs JAX sees: starts the backend (``jax.devices("gpu")``)."""
    import jax

    return list(jax.devices("gpu"))


# How GPU mode counts its GPUs. Tests replace it to check GPU mode on a machine without one.
gpu_devices: Callable[[], Sequence[object]] = _jax_gpu_devices


def platforms_problem(env_platforms: str, has_gpu: bool) -> str | None:
    """Why ``JAX_PLATFORMS`` cannot work on this machine (and the fix), or None."""
    platforms = {p.strip() for p in env_platforms.lower().split(",") if p.strip()}
    if platforms & {"cuda", "gpu"} and not has_gpu:
        return (
            f"JAX_PLATFORMS={env_platforms} but this machine has no NVIDIA GPU (no driver "
            "found). Unset JAX_PLATFORMS or set JAX_PLATFORMS=cpu."
        )
    return None


def _choose(mode: str, has_gpu: bool, env_platforms: str) -> Mode:
    """CPU or GPU mode for ``setup(mode=...)``, or a SetupError saying what to change."""
    if mode not in ("auto", "cpu", "gpu"):
        raise SetupError(f"mode must be 'auto', 'cpu' or 'gpu', got {mode!r}")
    if mode == "gpu" and not has_gpu:
        raise SetupError(
            "mode='gpu' was asked for but this machine has no NVIDIA GPU (no driver found). "
            "Use mode='cpu' (the lab's CPU mode compiles for H100 targets without a GPU)."
        )
    platforms = {p.strip() for p in env_platforms.lower().split(",") if p.strip()}
    if mode == "auto" and (problem := platforms_problem(env_platforms, has_gpu)):
        raise SetupError(problem)
    if mode == "auto" and platforms and not platforms & {"cuda", "gpu"}:
        return "cpu"  # JAX_PLATFORMS=cpu picks CPU mode for this run, GPU or not
    return "gpu" if (mode == "gpu" or (mode == "auto" and has_gpu)) else "cpu"


# More virtual CPU devices teach nothing new and cost memory and start-up time (100,000 took
# 10 minutes and 19.6 GB here; 1,024 start in 7 s with 0.6 GB). The lab uses 8.
MAX_CPU_DEVICES = 1024


def cpu_devices_problem(cpu_devices: object) -> str | None:
    """Why ``cpu_devices`` is not a usable number of virtual CPU devices, or None."""
    if isinstance(cpu_devices, bool) or not isinstance(cpu_devices, int):
        return f"cpu_devices must be a whole number such as 8, got {cpu_devices!r}"
    if not 1 <= cpu_devices <= MAX_CPU_DEVICES:
        return (
            f"cpu_devices must be between 1 and {MAX_CPU_DEVICES}, got {cpu_devices}: each "
            "virtual device costs memory and start-up time; the lab uses 8"
        )
    return None


def cache_dir() -> Path:
    """The kit's cache folder: ``$LABKIT_CACHE_DIR``, else ``~/.cache/labkit``.

    It holds what is slow to find out again and safe to keep (the XLA flags this jaxlib
    accepts, stored compiles): deleting it costs time only.
    """
    return Path(os.environ.get("LABKIT_CACHE_DIR") or Path.home() / ".cache" / "labkit")


def _flags_cache() -> Path:
    return cache_dir() / f"xla-flags-accepted-{_version('jaxlib')}.json"


def _accepted_flags() -> list[str]:
    try:
        found = json.loads(_flags_cache().read_text())
    except (OSError, ValueError):
        return []
    return [f for f in found if isinstance(f, str)] if isinstance(found, list) else []


def remember_accepted_xla_flags(flags: str) -> None:
    """Note that the installed jaxlib accepts this XLA_FLAGS string: setup() skips its check."""
    if flags in (known := _accepted_flags()):
        return
    with contextlib.suppress(OSError):  # a cache that cannot be written costs time only
        _flags_cache().parent.mkdir(parents=True, exist_ok=True)
        tmp = _flags_cache().with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps([*known, flags][-100:]))
        os.replace(tmp, _flags_cache())


def xla_flags_problem(flags: str, timeout_s: float = 600.0) -> str | None:
    """Why these XLA_FLAGS would abort JAX (what ``labkit flags check`` says), or None.

    The check is the ``labkit flags check`` command itself, in a subprocess: it tries the flags
    in fresh processes (about 1 s each the first time, then cached per jaxlib) and keeps this
    module free of JAX and of the layers above it. Accepted flag strings are remembered per
    jaxlib version, so an unchanged XLA_FLAGS costs no subprocess at all.
    """
    if not flags.strip() or flags in _accepted_flags():
        return None
    cmd = [sys.executable, "-m", "labkit", "flags", "check", flags]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"checking XLA_FLAGS={flags!r} took over {timeout_s:g} s; try `labkit flags check`"
    if out.returncode == 0:
        remember_accepted_xla_flags(flags)
        return None
    said = (out.stdout.strip() + "\n" + out.stderr.strip()).strip()
    return f"XLA_FLAGS would abort JAX at its first operation (a dead kernel):\n{said}"


def scratch_dir(prefix: str = "labkit-") -> Path:
    """A new temporary folder, removed with its contents when this Python process exits.

    For files a notebook keeps across cells: the folder goes at the kernel's exit, after an
    error too. A kernel killed outright runs no exit handlers (nbval stops its kernels that
    way, and ``labkit run`` a timed-out one): its folders are removed by the next call here,
    in any process, once their owner is gone.
    """
    sweep_scratch()
    return Path(tempfile.mkdtemp(prefix=prefix, dir=_scratch_owner()))


@functools.cache
def _scratch_owner() -> Path:
    """This process's ``labkit-scratch-<pid>`` folder, removed when the process exits."""
    owner = Path(tempfile.gettempdir()) / f"labkit-scratch-{os.getpid()}"
    owner.mkdir(exist_ok=True)
    atexit.register(shutil.rmtree, owner, ignore_errors=True)
    return owner


def sweep_scratch(root: Path | None = None) -> list[Path]:
    """Remove the scratch folders of processes that are gone; return what was removed."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob("labkit-scratch-*"):
        pid = folder.name.removeprefix("labkit-scratch-")
        if pid.isdigit() and int(pid) != os.getpid() and not _process_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def reuse_freed_memory() -> bool:
    """Keep freed memory in this process for reuse (glibc's malloc only); True if it was set.

    XLA:CPU allocates each run's temporary buffers with malloc and frees them after the run.
    glibc hands blocks above its mmap threshold (128 KiB, rising to 32 MiB) straight back to
    the kernel, so the next run gets fresh pages, zero-filled on first touch: about 17,000
    page faults per training step of the small GPT, a quarter of its CPU step time
    (``make bench``). With mmap and trimming off, freed blocks stay in the heap and the next
    run reuses them. The cost: the process keeps its peak memory until it exits.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl, for one): leave malloc alone
        return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def setup(
    cpu_devices: int = 8,
    mode: Literal["auto", "cpu", "gpu"] = "auto",
    xla_flags: Sequence[str] = (),
    quiet: bool = True,
    notes: bool = True,
) -> Setup:
    """Choose CPU or GPU mode, set the CPU device count and XLA flags, before JAX starts.

    Args:
      cpu_devices: number of virtual CPU devices in CPU mode (the lab uses 8).
      mode: ``"auto"`` picks GPU when an NVIDIA GPU is present, else CPU; with
        ``JAX_PLATFORMS=cpu`` in the environment it picks CPU even on a GPU machine.
        ``"cpu"`` or ``"gpu"`` force a mode. GPU mode starts the backend to count the GPUs.
      xla_flags: extra ``--name=value`` flags appended to ``XLA_FLAGS``. The merged flags are
        checked as ``labkit flags check`` does (:func:`xla_flags_problem`): a flag that would
        kill the process at JAX's first operation raises SetupError instead.
      quiet: silence XLA's C++ log lines (they carry timestamps and PIDs).
      notes: print :func:`environment_notes` to stderr, once per process: a jax, jaxlib or
        CUDA plugin other than the calibrated version, a plugin jaxlib refuses, on Colab or
        Kaggle what to install. Nothing is printed where the versions are the calibrated ones.

    In CPU mode it also keeps freed memory for reuse (:func:`reuse_freed_memory`).
    """
    global _current
    if problem := cpu_devices_problem(cpu_devices):
        raise SetupError(problem)
    env_platforms = os.environ.get("JAX_PLATFORMS", "")
    chosen = _choose(mode, nvidia_gpu_present() if mode != "cpu" else False, env_platforms)
    flags = _merge_xla_flags(os.environ.get("XLA_FLAGS", ""), xla_flags)

    if backend_started():
        done = _current
        if (
            done is not None
            and (done.mode, done.xla_flags) == (chosen, tuple(flags.split()))
            and (chosen == "gpu" or done.num_devices == cpu_devices)
        ):
            return done  # re-running the first cell with the same settings is harmless
        raise SetupError(
            "The JAX backend has already started, so the device count and XLA_FLAGS can no "
            f"longer change: {_RESTART_HINT}."
        )

    if problem := xla_flags_problem(flags):
        raise SetupError(
            f"{problem}\nFix or unset XLA_FLAGS (in the shell that started Jupyter, or in "
            "setup(xla_flags=...)), then restart the kernel."
        )
    if quiet:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if flags:
        os.environ["XLA_FLAGS"] = flags
    if chosen == "cpu":
        # Keeps the CUDA plugin (installed for deviceless H100 compiles) from probing for a GPU.
        os.environ["JAX_PLATFORMS"] = "cpu"
        import jax

        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", cpu_devices)
        reuse_freed_memory()
        _current = Setup("cpu", cpu_devices, tuple(flags.split()))
        if notes:
            say_environment_notes()
        return _current
    if env_platforms and not {"cuda", "gpu"} & set(env_platforms.lower().split(",")):
        os.environ.pop("JAX_PLATFORMS")  # mode="gpu" overrides JAX_PLATFORMS=cpu
        if "jax" in sys.modules:
            sys.modules["jax"].config.update("jax_platforms", None)
    try:
        count = len(gpu_devices())
    except RuntimeError as exc:
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SetupError(
            f"GPU mode: JAX found no usable GPU ({why}). On a GPU "
            "machine run `make setup` there (it installs jax[cuda12]), check `nvidia-smi`, "
            "or use mode='cpu'."
        ) from None
    if count == 0:
        raise SetupError("GPU mode: JAX sees 0 GPUs; check `nvidia-smi` or use mode='cpu'.")
    _current = Setup("gpu", count, tuple(flags.split()))
    if notes:
        say_environment_notes()
    return _current


_notes_said = False


def say_environment_notes() -> None:
    """Print :func:`environment_notes` to stderr, the first time in this process only.

    stderr, so that a subprocess whose stdout is data (JSON) stays parseable.
    """
    global _notes_said
    if _notes_said:
        return
    _notes_said = True
    for note in environment_notes():
        print(f"labkit: {note}", file=sys.stderr)


def current() -> Setup | None:
    """The settings of the last successful :func:`setup` in this process, if any."""
    return _current


# --------------------------------------------------------------------------------------
# Reports


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


# --------------------------------------------------------------------------------------
# Versions: the lessons' claims hold for one jaxlib and its CUDA plugin


# The version of jax, jaxlib and the CUDA plugin the lessons are calibrated to: their claims
# count kernels, collectives and tiles of programs that this jaxlib and its plugin's XLA
# build. constraints.txt pins the same (tests/test_packaging.py checks that they agree).
CALIBRATED = "0.12.0.1"

# The CUDA plugin comes as two wheels per CUDA version: jax-cudaNN-plugin (GPU kernels, which
# jaxlib loads only at its own version) and jax-cudaNN-pjrt (the PJRT plugin: XLA:GPU, the
# compiler of every deviceless H100 program).
CUDA_WHEELS = ("jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt")


def installed_versions() -> dict[str, str | None]:
    """Installed versions of jax, jaxlib and the CUDA plugin's wheels (None: not installed)."""
    return {name: _version(name) for name in ("jax", "jaxlib", *CUDA_WHEELS)}


def _release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version (``0.12.0.1`` in ``0.12.0.1.dev1``), as jaxlib compares
    a plugin's version with its own."""
    found = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(n) for n in found.group(0).split(".")) if found else ()


def version_problems(versions: Mapping[str, str | None] | None = None) -> list[str]:
    """What cannot work in this mix of jax, jaxlib and CUDA plugin wheels, each with its fix.

    A CUDA plugin wheel of another version than jaxlib is one: jaxlib refuses the plugin's
    kernels (its warning: "... is not compatible with the installed jaxlib version ..., so it
    will not be used"), while the PJRT plugin still compiles, with its own version's XLA, so
    deviceless H100 programs would silently be another version's.
    """
    found = installed_versions() if versions is None else versions
    jaxlib = found.get("jaxlib")
    if jaxlib is None:
        return ["jaxlib is not installed: pip install jaxlib (the version of your jax)"]
    problems = []
    for cuda in ("12", "13"):
        wheels = [f"jax-cuda{cuda}-plugin", f"jax-cuda{cuda}-pjrt"]
        other = {w: v for w in wheels if (v := found.get(w)) and _release(v) != _release(jaxlib)}
        if other:
            listed = ", ".join(f"{w} {v}" for w, v in other.items())
            problems.append(
                f"{listed} {'does' if len(other) == 1 else 'do'} not match jaxlib {jaxlib}: "
                "jaxlib refuses a CUDA plugin of another version, and deviceless H100 programs "
                "would come from that version's XLA. Install the plugin of this jaxlib: "
                + "pip install "
                + " ".join(f'"{w}=={jaxlib}"' for w in wheels)
            )
    return problems


def version_difference(versions: Mapping[str, str | None] | None = None) -> str | None:
    """Which of jax, jaxlib and the CUDA plugin differ from the calibrated version, or None."""
    found = installed_versions() if versions is None else versions
    calibrated = _release(CALIBRATED)
    other = {name: v for name, v in found.items() if v is not None and _release(v) != calibrated}
    if not other:
        return None
    here = ", ".join(f"{name} {v}" for name, v in other.items())
    return f"the lessons' claims are calibrated to jax and jaxlib {CALIBRATED}; here: {here}"


def stale_import_problem() -> str | None:
    """Why this process runs another jax than the one installed now (and the fix), or None.

    ``pip install`` in a running kernel replaces the files but not the jax already imported.
    """
    loaded = sys.modules.get("jax")
    have = getattr(loaded, "__version__", None)
    installed = _version("jax")
    if have is None or installed is None or have == installed:
        return None
    restart = "Runtime > Restart session" if hosted_notebook() == "Colab" else "Kernel > Restart"
    return (
        f"this process imported jax {have}, but jax {installed} is installed now (pip ran after "
        f"the import): restart the kernel ({restart}) and run the first cell again"
    )


def hosted_notebook() -> str | None:
    """``"Kaggle"`` or ``"Colab"`` when this Python runs in that hosted notebook, else None."""
    # The markers Kaggle's own client library reads (Kaggle/kagglehub, src/kagglehub/env.py:
    # is_in_kaggle_notebook, is_in_colab_notebook): a Kaggle notebook sets
    # KAGGLE_KERNEL_RUN_TYPE, a Colab runtime COLAB_RELEASE_TAG. Kaggle's image is built on
    # Colab's, so Kaggle is asked first.
    if "KAGGLE_KERNEL_RUN_TYPE" in os.environ:
        return "Kaggle"
    if "COLAB_RELEASE_TAG" in os.environ:
        return "Colab"
    return None


def kit_source() -> tuple[str, str]:
    """Where this copy of the kit came from: ``(kind, where)``, kind one of ``"folder"`` (a
    checkout, installed editable or imported from it), ``"git"``, ``"url"`` or ``"index"``
    (read from pip's record of the install)."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").exists():
        return "folder", str(checkout)
    try:
        record = importlib.metadata.distribution("labkit").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        record = None
    return source_from_direct_url(record) if record else ("index", _version("labkit") or "")


def source_from_direct_url(record: str) -> tuple[str, str]:
    """``(kind, where)`` from a ``direct_url.json`` (PEP 610: what pip records of a package
    installed from a URL, a repository or a folder)."""
    try:
        origin = json.loads(record)
    except ValueError:
        return "index", _version("labkit") or ""
    url = str(origin.get("url", ""))
    if vcs := origin.get("vcs_info"):
        return "git", f"{url}@{vcs.get('commit_id') or vcs.get('requested_revision', '')}"
    if url.startswith("file://") and "dir_info" in origin:
        return "folder", url.removeprefix("file://")
    return "url", url


def install_command(extras: str = "lessons") -> str:
    """The pip line that installs this kit, from where this copy came, with ``extras``.

    A git source is pinned to the commit installed (never a branch: the lessons' claims are
    calibrated to one version); a folder installs with its ``constraints.txt``.
    """
    kind, where = kit_source()
    if kind == "git":
        return f'pip install "labkit[{extras}] @ git+{where}"'
    if kind == "url":
        return f'pip install "labkit[{extras}] @ {where}"'
    if kind == "index":
        return f'pip install "labkit[{extras}]=={where}"'
    constraints = Path(where) / "constraints.txt"
    pin = f"-c {constraints} " if constraints.exists() else ""
    return f'pip install {pin}-e "{where}[{extras}]"'


def environment_notes() -> list[str]:
    """What the first cell says about this environment: a kernel to restart, a CUDA plugin
    jaxlib refuses, versions other than the calibrated ones; on Colab or Kaggle, what to
    install. Empty where the environment is the one the lessons are calibrated to."""
    notes = [p for p in (stale_import_problem(), *version_problems()) if p]
    if difference := version_difference():
        notes.append(
            f"{difference}: some claims may fail, and a failed claim says so "
            "(`labkit doctor` compares the versions)"
        )
    where = hosted_notebook()
    if where and (notes or h100_compile_problem() is not None):
        notes.append(
            f"On {where}: install the kit with what the lessons need into this runtime, then "
            f"restart it and run this cell again:\n  %{install_command('lessons')}"
        )
    return notes


def plugins() -> dict[str, str]:
    """Installed PJRT plugins found through the ``jax_plugins`` entry-point group."""
    eps = importlib.metadata.entry_points(group="jax_plugins")
    return {ep.name: ep.value for ep in eps}


def info() -> dict[str, object]:
    """Versions, backend, devices and capabilities of this process, as plain data."""
    import jax

    from labkit.core.hardware import current_hardware

    devices = jax.devices()
    hw = current_hardware()
    return {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "flax": _version("flax"),
        "cuda_plugin": _version("jax-cuda12-plugin") or _version("jax-cuda13-plugin"),
        "plugins": sorted(plugins()),
        "backend": jax.default_backend(),
        "num_devices": len(devices),
        "device_kind": devices[0].device_kind,
        "gpu_present": nvidia_gpu_present(),
        "gpu_hardware": hw.name if hw else None,
        "h100_compile": h100_compile_available(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


# Where the pip-installed CUDA compiler tools live: CUDA 12's nvidia-cuda-nvcc-cu12, or
# CUDA 13's nvidia-cuda-nvcc (`make setup CUDA=13`), whose wheels share nvidia/cu13.
_CUDA_TOOL_PACKAGES = ("nvidia.cuda_nvcc", "nvidia.cu13")
_CUDA_PLUGINS = ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")


def find_cuda_dir() -> Path | None:
    """Directory of the pip-installed CUDA compiler tools (``ptxas``), if present."""
    for package in _CUDA_TOOL_PACKAGES:
        try:
            spec = importlib.util.find_spec(package)
        except ModuleNotFoundError:  # "nvidia" itself is absent
            return None
        for location in (spec.submodule_search_locations or []) if spec else []:
            if (Path(location) / "bin" / "ptxas").exists():
                return Path(location)
    return None


def _importable(module: str) -> bool:
    """True when ``module`` can be found; False also when a parent package is absent."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # find_spec("a.b") imports "a", and raises when "a" is absent
        return False


AOT_EXTRA_HINT = (
    "the kit's `aot` extra: in the kit's folder `pip install -c constraints.txt -e \".[aot]\"` "
    "(`make setup` installs it; for CUDA 13 the `aot13` extra)"
)


def h100_compile_problem() -> str | None:
    """Why H100 targets cannot be compiled here (what to install), or None when they can."""
    if not any(_importable(name) for name in _CUDA_PLUGINS):
        return (
            "the CUDA PJRT plugin is not installed: deviceless H100 compiles need it and ptxas, "
            f"{AOT_EXTRA_HINT}"
        )
    if find_cuda_dir() is None:
        return f"ptxas was not found (pip package nvidia-cuda-nvcc-cu12): install {AOT_EXTRA_HINT}"
    if problems := version_problems():
        return " ".join(problems)
    return None


def h100_compile_available() -> bool:
    """True when the CUDA plugin and ptxas are installed, so H100 targets can be compiled."""
    return h100_compile_problem() is None


def report(rows: dict[str, object] | None = None) -> str:
    """A short human-readable environment report (also printed by ``labkit doctor``)."""
    rows = info() if rows is None else rows
    width = max(len(k) for k in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows.items())


def show() -> dict[str, object]:
    """Print the environment report in a notebook and record backend and device count."""
    from labkit.core.report import record

    rows = info()
    print(report(rows))
    if (problem := h100_compile_problem()) is not None:
        print(f"H100 compiles: unavailable here: {problem}.")
        print("The CPU parts run; the first cell that compiles for H100s stops with this message.")
    record("backend", rows["backend"], measured=True)
    record("num_devices", rows["num_devices"], measured=True)
    return rows
