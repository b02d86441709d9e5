"""Compile JAX programs for NVIDIA H100 (or B200) GPUs on a machine that has none (deviceless AOT).

The CUDA PJRT plugin can describe a *compile-only* topology from a target spec, a text
``GpuTargetConfigProto``. ``jax.jit(f).lower(...).compile()`` on such devices runs the real
XLA:GPU pipeline (SPMD partitioning, fusion, GEMM rewrites, collective scheduling, PTX
generation with ptxas) and returns the optimized HLO. Nothing runs: the output is what XLA
*would* execute on H100s. Autotuning needs a GPU, so each Triton GEMM gets XLA's first config
that compiles, unless ``compile_for_gpu(..., tiles="rule")`` gives it the kit's stated rule
(:mod:`labkit.xla.tiles`).

Two targets: ``"H100 SXM"`` (Hopper, compute capability 9.0, the kit's default) and ``"B200"``
(Blackwell, compute capability 10.0): :func:`gpu_mesh` takes either, :func:`h100_mesh` and
:func:`b200_mesh` name them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypedDict

from labkit.core.env import h100_compile_problem
from labkit.core.hardware import hardware
from labkit.core.mesh import abstract, make_mesh
from labkit.core.types import CompilerOption, PyTree
from labkit.xla import compile_cache
from labkit.xla import tiles as gemm_tiles
from labkit.xla.compile_cache import StoredCompile
from labkit.xla.tiles import Tiles

if TYPE_CHECKING:
    from jax import Device
    from jax.experimental.topologies import TopologyDescription
    from jax.sharding import Mesh
    from jax.stages import Compiled

__all__ = [
    "B200_TARGET",
    "DEVICE_KINDS",
    "H100_SXM_TARGET",
    "KERNEL_CACHE_OPTION",
    "AotResult",
    "AotUnavailable",
    "JitKwargs",
    "abstract",
    "b200_mesh",
    "check_available",
    "compile_for_gpu",
    "gpu_mesh",
    "gpu_topology",
    "h100_mesh",
    "h100_topology",
    "kernel_cache_for",
    "self_test",
    "target_config",
]

# The GpuTargetConfigProto of a deviceless GPU. Chip figures (SMs, clock, L2, HBM size and
# bandwidth, compute capability) come from the hardware table (labkit.core.hardware); the
# rest are fixed by the compute capability (CUDA C Programming Guide, "Compute Capabilities",
# technical specifications per compute capability), identical for 9.0 (Hopper) and 10.0
# (Blackwell B200): 1024 threads per block, 2048 threads and 65536 32-bit registers per SM,
# 65536 registers per block, 48 KB static and 227 KB = 232448 bytes opt-in shared memory per
# block, 228 KB = 233472 bytes per SM, grid limits 2^31-1 x 65535 x 65535. (XLA's own spec
# files for these GPUs, xla/tools/hlo_opt/gpu_specs/{h100_sxm,b200}.txtpb, carry the same
# limits.) runtime_version matters: without it XLA does not rewrite FP8 dots to cuBLASLt FP8
# calls; CUDA 12.8 is the first with sm_100.
_TARGET_TEMPLATE = """
gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: {sm_count}
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth}
  l2_cache_size: {l2}
  clock_rate_ghz: {clock}
  device_memory_size: {memory}
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: {major} minor: {minor} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 patch: 0 }}
runtime_version {{ major: 12 minor: 8 patch: 0 }}
device_description_str: "{description}"
"""

# Hardware-table name -> the device_kind a compile-only device of that target reports (the
# name CUDA gives the part). Only GPUs whose per-compute-capability limits are the template's.
DEVICE_KINDS: dict[str, str] = {"H100 SXM": "NVIDIA H100 80GB HBM3", "B200": "NVIDIA B200"}
_SUPPORTED_CC = ((9, 0), (10, 0))


def target_config(gpu: str = "H100 SXM") -> str:
    """The text ``GpuTargetConfigProto`` of a deviceless target (``"H100 SXM"``, ``"B200"``)."""
    hw = hardware(gpu)
    missing = [
        name
        for name, value in (("SM count", hw.sm_count), ("clock", hw.clock_ghz), ("L2", hw.l2_mb))
        if value is None
    ]
    if hw.name not in DEVICE_KINDS or hw.compute_capability not in _SUPPORTED_CC or missing:
        raise ValueError(
            f"deviceless targets are written for {', '.join(DEVICE_KINDS)} (compute capability "
            f"9.0 or 10.0, chip figures in the hardware table); {hw.name} is not one"
            + (f" (no {', '.join(missing)} in the table)" if missing else "")
        )
    major, minor = hw.compute_capability
    return _TARGET_TEMPLATE.format(
        sm_count=hw.sm_count,
        bandwidth=round(hw.hbm_gbps * 1e9),
        l2=round((hw.l2_mb or 0) * 2**20),
        clock=hw.clock_ghz,
        memory=round(hw.memory_gb * 2**30),
        major=major,
        minor=minor,
        description=DEVICE_KINDS[hw.name],
    )


H100_SXM_TARGET = target_config("H100 SXM")
B200_TARGET = target_config("B200")
MAX_GPUS_PER_HOST = 16


class AotUnavailable(RuntimeError):
    """Deviceless GPU compilation is not possible here; the message says what to install."""


def check_available() -> None:
    """Raise :class:`AotUnavailable` with the fix when H100 compiles cannot work here."""
    problem = h100_compile_problem()
    if problem is not None:
        raise AotUnavailable(problem)


@functools.cache
def gpu_topology(
    target: str = "H100 SXM", num_gpus: int = 8, num_hosts: int = 1
) -> TopologyDescription:
    """A compile-only topology of ``num_hosts`` hosts with ``num_gpus`` ``target`` GPUs each."""
    if not 1 <= num_gpus <= MAX_GPUS_PER_HOST:
        raise ValueError(
            f"num_gpus must be 1..{MAX_GPUS_PER_HOST} per host, got {num_gpus}; "
            "for more GPUs add hosts with num_hosts"
        )
    if num_hosts < 1:
        raise ValueError(f"num_hosts must be >= 1, got {num_hosts}")
    config = target_config(target)
    check_available()
    from jax.experimental import topologies

    return topologies.get_topology_desc(
        platform="cuda",
        target_config=config,
        topology=f"1x{num_hosts}x{num_gpus}",
    )


def h100_topology(num_gpus: int = 8, num_hosts: int = 1) -> TopologyDescription:
    """A compile-only topology of ``num_hosts`` hosts with ``num_gpus`` H100 SXM GPUs each."""
    return gpu_topology("H100 SXM", num_gpus, num_hosts)


def gpu_mesh(
    shape: Sequence[int],
    names: Sequence[str],
    target: str = "H100 SXM",
    num_hosts: int = 1,
    explicit: bool = False,
) -> Mesh:
    """A mesh of compile-only ``target`` GPUs; ``prod(shape)`` GPUs over ``num_hosts`` hosts.

    Axes are ``Auto`` (GSPMD-style propagation) unless ``explicit`` is set.
    """
    if len(shape) != len(names):
        raise ValueError(
            f"mesh shape {tuple(shape)} and axis names {tuple(names)} differ in length"
        )
    total = math.prod(shape)
    if num_hosts < 1 or total % num_hosts:
        raise ValueError(
            f"mesh {tuple(shape)} has {total} GPUs, not divisible by {num_hosts} hosts"
        )
    topo = gpu_topology(target, total // num_hosts, num_hosts)
    return make_mesh(shape, names, devices=list(topo.devices), explicit=explicit)


def h100_mesh(
    shape: Sequence[int],
    names: Sequence[str],
    num_hosts: int = 1,
    explicit: bool = False,
) -> Mesh:
    """A mesh of compile-only H100s; ``prod(shape)`` GPUs spread over ``num_hosts`` hosts.

    Axes are ``Auto`` (GSPMD-style propagation) unless ``explicit`` is set.
    """
    return gpu_mesh(shape, names, "H100 SXM", num_hosts, explicit)


def b200_mesh(
    shape: Sequence[int],
    names: Sequence[str],
    num_hosts: int = 1,
    explicit: bool = False,
) -> Mesh:
    """A mesh of compile-only B200s (Blackwell, sm_100); as :func:`h100_mesh` otherwise."""
    return gpu_mesh(shape, names, "B200", num_hosts, explicit)


@dataclasses.dataclass(frozen=True)
class AotResult:
    """A deviceless compile: the compiled object and its optimized, scheduled GPU HLO.

    ``compiled`` is JAX's ``Compiled``, or, for a compile served from the kit's compile cache
    (:mod:`labkit.xla.compile_cache`), a :class:`~labkit.xla.compile_cache.StoredCompile` that
    answers ``as_text()``, ``memory_analysis()`` and ``cost_analysis()`` as XLA did.
    """

    compiled: Compiled | StoredCompile
    hlo: str
    num_devices: int
    seconds: float  # XLA's compile, wall clock (for a stored compile: when it was compiled)
    tiles: Tiles = "untuned"  # where its GEMM tiles came from (labkit.xla.tiles)

    @property
    def from_cache(self) -> bool:
        """Whether this compile was served from the kit's compile cache (nothing compiled)."""
        return isinstance(self.compiled, StoredCompile)


class JitKwargs(TypedDict, total=False):
    """Keyword arguments of ``jax.jit`` that :func:`compile_for_gpu` passes on."""

    in_shardings: PyTree
    out_shardings: PyTree
    static_argnums: int | Sequence[int]
    static_argnames: str | Iterable[str]
    donate_argnums: int | Sequence[int]
    donate_argnames: str | Iterable[str]
    keep_unused: bool


def compile_for_gpu(
    fn: Callable[..., object],
    *args: PyTree,
    compiler_options: Mapping[str, CompilerOption | bytes] | None = None,
    jit_kwargs: JitKwargs | None = None,
    cache: bool = True,
    tiles: Tiles | None = None,
) -> AotResult:
    """Compile ``fn`` for the compile-only GPUs that ``args``' shardings live on.

    ``args`` are ``ShapeDtypeStruct`` trees whose shardings use a :func:`gpu_mesh` (an
    :func:`h100_mesh` or :func:`b200_mesh`; see :func:`abstract`). ``compiler_options`` are
    per-compile XLA options (:data:`~labkit.core.types.CompilerOptions`, or ``fdo_profile``:
    a PGLE profile as bytes): an unknown name raises here instead of killing the process,
    unlike ``XLA_FLAGS``. A compile done before, in any process, is served from the kit's
    compile cache (:mod:`labkit.xla.compile_cache`), except with ``cache=False`` (a cell that
    times the compile, needs the executable itself or shows this process's own JAX caching:
    it compiles and stores nothing) and for a compile that writes dumps.

    ``tiles`` says where the Triton GEMM tiles come from (:mod:`labkit.xla.tiles`):
    ``"untuned"``, XLA's first config that compiles (what a deviceless compile does alone), or
    ``"rule"``, the kit's stated rule handed to XLA as autotune results (two compiles, timed
    together; cached under the rule's identity, :func:`labkit.xla.tiles.cache_marker`); None
    takes ``$LABKIT_TILES`` (default ``"rule"``). XLA's kernel cache file, where one is
    named, is kept apart per tiles (:func:`kernel_cache_for`).
    """
    import jax

    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    devices = _devices_of(args)
    kinds = {d.device_kind for d in devices}
    if not devices or not kinds <= set(DEVICE_KINDS.values()) or len(kinds) > 1:
        found = sorted(kinds) or ["no sharded inputs"]
        raise ValueError(
            "compile_for_gpu needs inputs sharded on one compile-only GPU mesh (an H100 mesh "
            f"or a B200 mesh), got {', '.join(found)}: build them with "
            "labkit.xla.aot.abstract(tree, h100_mesh(...), spec) (or b200_mesh)"
        )
    chosen = gemm_tiles.default_tiles() if tiles is None else tiles
    if chosen not in gemm_tiles.TILES:
        raise ValueError(f"tiles must be one of {', '.join(gemm_tiles.TILES)}, got {chosen!r}")
    jitted = fn if hasattr(fn, "lower") and not jit_kwargs else jax.jit(fn, **(jit_kwargs or {}))
    lowered = jitted.lower(*args)
    options = kernel_cache_for(dict(compiler_options or {}), chosen)
    digest = None
    if cache and compile_cache.enabled() and not compile_cache.dumps_files(options):
        keyed = {**options, **gemm_tiles.cache_marker(chosen)}
        digest = compile_cache.key(lowered, keyed, sorted(devices, key=lambda d: d.id))
        stored = compile_cache.load(digest)
        if stored is not None:
            return AotResult(stored, stored.text, len(devices), stored.seconds, chosen)
    start = time.perf_counter()
    if chosen == "rule":
        kind = next(iter(kinds))
        compiled, _, seconds = gemm_tiles.compile_with_rule(lowered, options, kind)
    else:
        compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
        seconds = time.perf_counter() - start
    text = compiled.as_text()
    if text is None:  # jaxlib returns None where a backend cannot print its program
        raise RuntimeError(
            "XLA compiled the program but gives no HLO text for it (Compiled.as_text() is "
            "None): compile for a compile-only GPU mesh (h100_mesh, b200_mesh)"
        )
    if digest is not None:
        compile_cache.store(digest, compiled, text, seconds)
    return AotResult(compiled, text, len(devices), seconds, chosen)


KERNEL_CACHE_OPTION = "xla_gpu_kernel_cache_file"


def kernel_cache_for(
    options: Mapping[str, CompilerOption | bytes], tiles: Tiles
) -> dict[str, CompilerOption | bytes]:
    """``options`` with XLA's kernel cache file made the one for ``tiles``: for the rule, a
    file beside the named one (``<file>.rule``).

    XLA's kernel cache keys a kernel by its fused computation, not by its tile config:
    measured here, a rule compile sharing the file of an untuned one launched the untuned
    GEMM kernels (16x8 tiles, 1 KB of shared memory) under the rule's configs.
    """
    out = dict(options)
    named = out.get(KERNEL_CACHE_OPTION)
    if tiles == "rule" and isinstance(named, str) and named:
        out[KERNEL_CACHE_OPTION] = f"{named}.rule"
    return out


def _devices_of(args: Sequence[PyTree]) -> set[Device]:
    import jax

    found: set[Device] = set()
    for leaf in jax.tree.leaves(args):
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None:
            found |= set(sharding.device_set)
    return found


def self_test() -> float:
    """Compile a tiny matmul for one H100 and return the seconds it took; raise if it fails."""
    import jax.numpy as jnp

    start = time.perf_counter()
    mesh = h100_mesh((1,), ("x",))
    x = abstract(jnp.zeros((128, 128), jnp.bfloat16), mesh)
    try:
        result = compile_for_gpu(jnp.matmul, x, x, cache=False)  # a real compile, timed
    except Exception as exc:  # ptxas, the plugin or the target spec: report, do not hide
        raise AotUnavailable(f"an H100 test compile failed: {type(exc).__name__}: {exc}") from exc
    if "ENTRY" not in result.hlo:
        raise AotUnavailable("an H100 test compile returned no HLO")
    return time.perf_counter() - start
