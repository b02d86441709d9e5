"""PJRT, the device interface under JAX: plugins, their C API versions, clients, devices.

A PJRT plugin is a shared library exporting ``GetPjrtApi``, which returns a ``PJRT_Api``
struct: ``struct_size`` (size_t), ``extension_start`` (pointer), then ``pjrt_api_version``
(``struct_size``, ``extension_start``, ``int major_version``, ``int minor_version``), then
the function pointers (``xla/pjrt/c/pjrt_c_api.h`` in openxla/xla). We read that version
from the library with ctypes: no GPU needed. Packages advertise plugins in the
``jax_plugins`` entry-point group (or namespace package); JAX imports each and calls its
``initialize()``. Also: fresh-process experiments (persistent cache, plugin discovery) and
a tiny XLA FFI custom call in C++. The C API driven by hand with ctypes is
``labkit.runtime.pjrt_capi``; a plugin that wraps another, ``labkit.runtime.pjrt_wrapper``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from labkit.core.types import JSON

if TYPE_CHECKING:  # JAX is imported inside the functions that use it
    import jax

GROUP = "jax_plugins"  # the entry-point group (and namespace package) JAX scans
_ELF_MAGIC = b"\x7fELF"
_FRAMEWORK_RE = re.compile(r"framework PJRT API version is (\d+)\.(\d+)")
_PLUGIN_RE = re.compile(r"PJRT plugin has PJRT API version (\d+)\.(\d+)")


class PluginError(RuntimeError):
    """A PJRT plugin library cannot be used; the message says what is wrong and what to do."""


class CompilerNotFound(RuntimeError):
    """No C++ compiler here, so C++ (FFI handlers, the wrapping plugin) cannot be built."""


@dataclasses.dataclass(frozen=True, order=True)
class ApiVersion:
    """A PJRT C API version: major.minor (the minor grows with every added function)."""

    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


@dataclasses.dataclass(frozen=True)
class Plugin:
    """An installed PJRT plugin: entry point, Python module, distribution and library."""

    name: str
    module: str
    dist: str | None
    dist_version: str | None
    library: Path | None
    api_version: ApiVersion | None


class _Version(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.c_void_p),
        ("major_version", ctypes.c_int),
        ("minor_version", ctypes.c_int),
    ]


class _ApiHeader(ctypes.Structure):  # the start of PJRT_Api; function pointers follow
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.c_void_p),
        ("pjrt_api_version", _Version),
    ]


def plugin_api_version(library: str | Path) -> ApiVersion:
    """The PJRT C API version a plugin library implements, read from ``GetPjrtApi()``."""
    path = Path(library)
    if not path.exists():
        raise PluginError(
            f"PJRT plugin library {path} does not exist: check the path, or reinstall the "
            "plugin package (pip show -f <package> lists its files)"
        )
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != _ELF_MAGIC:
        raise PluginError(
            f"{path} is not a shared library (it starts with {magic!r}, not an ELF header): "
            "a plugin's library_path must name its .so file"
        )
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise PluginError(f"{path} could not be loaded as a shared library: {exc}") from exc
    try:
        get_api = lib.GetPjrtApi
    except AttributeError:
        raise PluginError(
            f"{path} is a shared library but exports no GetPjrtApi symbol, so it is not a "
            "PJRT plugin (nm -D --defined-only <lib> | grep GetPjrtApi finds it in one)"
        ) from None
    get_api.restype = ctypes.c_void_p
    address = get_api()
    if not address:
        raise PluginError(f"GetPjrtApi() in {path} returned NULL: the plugin failed to start")
    header = _ApiHeader.from_address(address)
    version = header.pjrt_api_version
    if version.struct_size != ctypes.sizeof(_Version):
        raise PluginError(
            f"{path}: PJRT_Api_Version.struct_size is {version.struct_size}, expected "
            f"{ctypes.sizeof(_Version)}: not a PJRT_Api struct this reader understands"
        )
    return ApiVersion(version.major_version, version.minor_version)


def exports_pjrt_api(library: Path) -> bool:
    """True when ``library`` is a loadable shared library with a GetPjrtApi symbol."""
    try:
        return hasattr(ctypes.CDLL(str(library)), "GetPjrtApi")
    except OSError:
        return False


def plugin_library(module: str, load: bool = True) -> Path | None:
    """The shared library (exporting GetPjrtApi) shipped in a plugin's package folder.

    Checking the symbol loads each candidate into this process; ``load=False`` returns the
    package's only ``.so`` unchecked (None when there is not exactly one), so a notebook
    can hand the path to a fresh process and keep its own process free of the plugin.
    """
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    libraries = sorted(folder.glob("*.so"))
    if not load:
        return libraries[0] if len(libraries) == 1 else None
    return next((so for so in libraries if exports_pjrt_api(so)), None)


def installed_plugins() -> list[Plugin]:
    """PJRT plugins installed for this Python: entry points in ``jax_plugins`` and its modules."""
    found: dict[str, tuple[str, str | None, str | None]] = {}
    for ep in importlib.metadata.entry_points(group=GROUP):
        dist = ep.dist
        found[ep.value] = (ep.name, dist.name if dist else None, dist.version if dist else None)
    try:
        import jax_plugins  # the namespace package: plugins may just put a module in it

        for mod in sorted(m.name for m in pkgutil.iter_modules(jax_plugins.__path__)):
            found.setdefault(f"{GROUP}.{mod}", (mod, None, None))
    except ImportError:
        pass
    plugins = []
    for module, (name, dist_name, version) in sorted(found.items()):
        library = plugin_library(module)
        api = plugin_api_version(library) if library is not None else None
        plugins.append(Plugin(name, module, dist_name, version, library, api))
    return plugins


_PROBE_CHILD = """
import json, sys
from jax._src.lib import xla_client
xla_client.load_pjrt_plugin_dynamically("labkit_probe", sys.argv[1])
try:
    xla_client.initialize_pjrt_plugin("labkit_probe")
    print(json.dumps(None))
except Exception as exc:
    print(json.dumps(str(exc)))
"""
MIN_MINOR = 29  # oldest plugin minor version jaxlib 0.12.0.1 accepts (measured with a fake)


@dataclasses.dataclass(frozen=True)
class Probe:
    """jaxlib's verdict on a plugin library: both versions it logged and the error, if any."""

    framework: ApiVersion
    error: str | None
    plugin: ApiVersion | None = None  # what jaxlib read from the plugin (None: not logged)


def probe(library: str | Path, strict: bool = False, timeout_s: float = 120) -> Probe:
    """Load and initialize ``library`` as jaxlib does, in a fresh process; report the verdict.

    jaxlib prints its own ("framework") PJRT C API version only in a log line at this step.
    ``strict`` sets ENABLE_PJRT_COMPATIBILITY=0: versions must then match exactly.
    """
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0", "JAX_PLATFORMS": "cpu"}
    env.pop("ENABLE_PJRT_COMPATIBILITY", None)
    if strict:
        env["ENABLE_PJRT_COMPATIBILITY"] = "0"
    run = subprocess.run(
        [sys.executable, "-c", _PROBE_CHILD, str(library)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )
    match = _FRAMEWORK_RE.search(run.stderr)
    if match is None:
        raise PluginError(f"jaxlib printed no framework PJRT API version:\n{run.stderr[-1500:]}")
    lines = run.stdout.strip().splitlines()
    error = json.loads(lines[-1]) if lines else f"the process died (exit {run.returncode})"
    seen = _PLUGIN_RE.search(run.stderr)
    plugin = ApiVersion(int(seen[1]), int(seen[2])) if seen else None
    return Probe(ApiVersion(int(match[1]), int(match[2])), error, plugin)


def framework_api_version(library: str | Path | None = None) -> ApiVersion:
    """The PJRT C API version the installed jaxlib speaks, probed with a plugin library."""
    if library is None:
        libs = [p.library for p in installed_plugins() if p.library is not None]
        if not libs:
            raise PluginError("no PJRT plugin library is installed to probe jaxlib with")
        library = libs[0]
    return probe(library).framework


def compatibility(plugin: ApiVersion, framework: ApiVersion, strict: bool = False) -> str:
    """What jaxlib does with a plugin of API version ``plugin``, in plain words."""
    if plugin == framework:
        return f"match: both speak PJRT C API {framework}"
    if plugin.major != framework.major:
        return (
            f"refused: plugin {plugin}, jaxlib {framework}; a different major version is "
            "incompatible ('Mismatched PJRT plugin PJRT API major version')"
        )
    if strict:
        return (
            f"refused: plugin {plugin}, jaxlib {framework}; with ENABLE_PJRT_COMPATIBILITY=0 "
            "versions must match exactly ('Mismatched PJRT plugin PJRT API version')"
        )
    if plugin.minor < MIN_MINOR:
        return f"refused: plugin {plugin} is older than the oldest jaxlib accepts (0.{MIN_MINOR})"
    older = "plugin" if plugin < framework else "jaxlib"
    return (
        f"accepted without a word: plugin {plugin}, jaxlib {framework} (compatibility mode, "
        f"the default); calls the {older} lacks fail only when made ('requires PJRT C API "
        "version 0.N or higher'), and the pair was never tested together"
    )


def fix_for(plugin: Plugin, jaxlib_version: str) -> str | None:
    """The pip command that realigns a plugin package with jaxlib, or None when aligned."""
    if plugin.dist is None or plugin.dist_version == jaxlib_version:
        return None
    return (
        f"{plugin.dist} {plugin.dist_version} was built for another jaxlib than {jaxlib_version}: "
        f'pip install "{plugin.dist}=={jaxlib_version}" (for CUDA also '
        f'"jax-cuda12-plugin=={jaxlib_version}", or simply "jax[cuda12]=={jaxlib_version}")'
    )


def loaded(library: str | Path) -> bool:
    """True when ``library`` is mapped into this process (``/proc/self/maps``; Linux)."""
    name = Path(library).resolve()
    maps = Path("/proc/self/maps")
    return maps.exists() and str(name) in maps.read_text()


def child_processes() -> list[int]:
    """Process ids of this process's live children (``/proc``; Linux; [] elsewhere)."""
    tasks = Path(f"/proc/{os.getpid()}/task")
    found: list[int] = []
    for task in tasks.iterdir() if tasks.exists() else []:
        children = task / "children"
        if children.exists():
            found += [int(pid) for pid in children.read_text().split()]
    return sorted(found)


# --------------------------------------------------------------------------------------
# The running client and its devices


class BackendRow(TypedDict):
    """One initialized JAX backend (:func:`backend_rows`)."""

    backend: str
    platform_version: str
    runtime: str
    devices: int
    c_api: str  # "built in", or the plugin's PJRT C API version


class DeviceRow(TypedDict):
    """One device (:func:`device_rows`)."""

    id: int
    platform: str
    kind: str
    process: int
    memory_stats: dict[str, int] | None  # None on CPU


def backend_rows() -> list[BackendRow]:
    """One row per initialized JAX backend: platform, version, runtime, C API version."""
    from jax._src import xla_bridge

    rows: list[BackendRow] = []
    for name, client in sorted(xla_bridge.backends().items()):
        api = xla_bridge.backend_pjrt_c_api_version(name)
        rows.append(
            {
                "backend": name,
                "platform_version": client.platform_version,
                "runtime": getattr(client, "runtime_type", "?"),
                "devices": client.device_count(),
                "c_api": "built in" if not api or api == (0, 0) else f"{api[0]}.{api[1]}",
            }
        )
    return rows


def device_rows() -> list[DeviceRow]:
    """One row per device: id, platform, kind, process and memory stats (None on CPU)."""
    import jax

    return [
        {
            "id": d.id,
            "platform": d.platform,
            "kind": d.device_kind,
            "process": d.process_index,
            "memory_stats": d.memory_stats(),
        }
        for d in jax.devices()
    ]


# --------------------------------------------------------------------------------------
# Experiments in fresh processes


def _run_child(
    args: Sequence[str], env: dict[str, str], timeout_s: float
) -> tuple[dict[str, JSON], str]:
    """Run ``python args...``; return the JSON of its last stdout line and its stderr."""
    run = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **env},
    )
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines:
        raise RuntimeError(f"child {args} failed (exit {run.returncode}):\n{run.stderr[-2000:]}")
    return json.loads(lines[-1]), run.stderr


def enable_persistent_cache(cache_dir: str | Path) -> None:
    """Turn on JAX's persistent compilation cache in ``cache_dir`` for every compile."""
    import jax

    jax.config.update("jax_compilation_cache_dir", str(cache_dir))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def timed_compile(lower: Callable[[], jax.stages.Lowered]) -> dict[str, Any]:
    """Time ``lower()`` and its ``.compile()``, counting persistent-cache hits and misses."""
    from jax import monitoring

    events: dict[str, int] = {}

    def count(event: str, **kwargs: str | int) -> None:
        events[event] = events.get(event, 0) + 1

    monitoring.register_event_listener(count)
    start = time.perf_counter()
    lowered = lower()
    mid = time.perf_counter()
    lowered.compile()
    end = time.perf_counter()
    return {
        "lower_s": mid - start,
        "compile_s": end - mid,
        "hits": events.get("/jax/compilation_cache/cache_hits", 0),
        "misses": events.get("/jax/compilation_cache/cache_misses", 0),
    }


def compile_in_fresh_process(
    module: str, cache_dir: str | Path, timeout_s: float = 300
) -> dict[str, JSON]:
    """Run ``python -m module cache_dir`` (which prints :func:`timed_compile`'s JSON)."""
    result, _ = _run_child(["-m", module, str(cache_dir)], {"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout_s)
    return result


def write_plugin_package(root: str | Path, name: str, library: str | Path) -> Path:
    """A minimal PJRT plugin package in ``root``: a module and a dist-info with the entry point.

    Its ``initialize()`` registers ``library`` under ``name``, as a real plugin does; put
    ``root`` on ``sys.path`` (``PYTHONPATH``) and JAX finds it at its first backend use.
    """
    root, module = Path(root), f"{name}_plugin"
    (root / module).mkdir(parents=True, exist_ok=True)
    (root / module / "__init__.py").write_text(
        f'"""A PJRT plugin skeleton."""\n\nLIBRARY = {str(library)!r}\n\n\n'
        "def initialize() -> None:\n"
        "    from jax._src import xla_bridge\n\n"
        f"    xla_bridge.register_plugin({name!r}, priority=1, library_path=LIBRARY)\n"
    )
    info = root / f"{module}-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n{name} = {module}\n")
    return root


def _discover_child() -> int:
    """Child side of :func:`discover`: start JAX (CPU) and report plugins and log lines."""
    import io
    import logging

    log = io.StringIO()
    handler = logging.StreamHandler(log)
    logger = logging.getLogger("jax._src.xla_bridge")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    import jax
    from jax._src import xla_bridge

    jax.config.update("jax_platforms", "cpu")
    jax.devices()  # discovers, imports and initializes every plugin
    print(json.dumps({"factories": sorted(xla_bridge._backend_factories), "log": log.getvalue()}))
    return 0


def discover(paths: Sequence[str | Path], timeout_s: float = 120) -> dict[str, JSON]:
    """Start JAX in a fresh CPU process with ``paths`` on PYTHONPATH; what it registered.

    Returns ``{"factories": [...], "log": str}``: the backend factories JAX registered and
    the ``jax._src.xla_bridge`` debug log (discovery, loading, plugin errors it swallowed).
    """
    env = {"PYTHONPATH": os.pathsep.join(map(str, paths)), "JAX_PLATFORMS": "cpu"}
    result, _ = _run_child(["-m", "labkit.runtime.pjrt", "discover"], env, timeout_s)
    return result


# --------------------------------------------------------------------------------------
# XLA FFI: custom calls written in C++


def find_cxx(compiler: str | None = None) -> str | None:
    """Path of a C++ compiler: ``compiler`` if given (None when unusable), else $CXX/g++/c++."""
    candidates = [compiler] if compiler else [os.environ.get("CXX", ""), "g++", "c++", "clang++"]
    for name in candidates:
        path = shutil.which(name) if name else None
        if path:
            return path
    return None


def build_library(
    source: str,
    workdir: str | Path,
    name: str,
    flags: Sequence[str] = (),
    compiler: str | None = None,
    purpose: str = "a shared library",
) -> Path:
    """Compile C++ ``source`` into ``workdir/lib<name>.so`` with the system compiler.

    Raises :class:`CompilerNotFound` (saying what to install) when there is no compiler, and
    RuntimeError with the compiler's output when the build fails.
    """
    cxx = find_cxx(compiler)
    if cxx is None:
        raise CompilerNotFound(
            f"no C++ compiler found ({compiler or '$CXX, g++, c++, clang++'}): install one "
            f"(apt-get install g++) to build {purpose}"
        )
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    src, library = workdir / f"{name}.cc", workdir / f"lib{name}.so"
    src.write_text(source)
    cmd = [cxx, "-std=c++17", "-O2", "-shared", "-fPIC", *flags, str(src), "-o", str(library)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{run.stderr[-2000:]}")
    return library


def build_ffi(
    source: str, workdir: str | Path, name: str = "ffi", compiler: str | None = None
) -> Path:
    """Compile C++ FFI handlers in ``source`` into ``workdir/lib<name>.so`` (~2 s with g++).

    The include path is ``jax.ffi.include_dir()``, which holds ``xla/ffi/api/ffi.h``.
    """
    import jax

    flags = ["-w", f"-I{jax.ffi.include_dir()}"]
    return build_library(source, workdir, name, flags, compiler, "XLA FFI handlers")


if __name__ == "__main__":
    if sys.argv[1:] == ["discover"]:
        sys.exit(_discover_child())
    sys.exit(f"usage: python -m labkit.runtime.pjrt discover (got {sys.argv[1:]})")
