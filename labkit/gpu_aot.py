"""Compile JAX programs for NVIDIA H100 GPUs on a machine that has none (deviceless AOT).

The CUDA PJRT plugin can describe a *compile-only* topology from a target spec, a text
``GpuTargetConfigProto``. ``jax.jit(f).lower(...).compile()`` on such devices runs the real
XLA:GPU pipeline (SPMD partitioning, fusion, GEMM rewrites, collective scheduling, PTX
generation with ptxas) and returns the optimized HLO. Nothing runs: the output is what XLA
*would* execute on H100s. Autotuning needs a GPU, so tile choices are XLA's defaults.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

# H100 SXM5 80GB as a GpuTargetConfigProto, written from public figures:
# - NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): 132 SMs on SXM5, 2048
#   threads / 65536 32-bit registers / 256 KB L1+shared per SM with up to 228 KB shared
#   (227 KB = 232448 bytes usable per block), 50 MB L2, compute capability 9.0.
# - NVIDIA H100 datasheet: 80 GB HBM3 at 3.35 TB/s, 1.98 GHz max boost clock (SXM5).
# - CUDA C Programming Guide, "Compute Capabilities" table: 1024 threads per block,
#   48 KB static shared memory per block, grid limits 2^31-1 x 65535 x 65535.
# runtime_version matters: without it XLA does not rewrite FP8 dots to cuBLASLt FP8 calls.
H100_SXM_TARGET = """
gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 85520809984
  shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 minor: 0 }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 8 patch: 0 }
runtime_version { major: 12 minor: 8 patch: 0 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""

MAX_GPUS_PER_HOST = 16


class AotUnavailable(RuntimeError):
    """Deviceless GPU compilation is not possible here; the message says what to install."""


def find_cuda_dir() -> Path | None:
    """Directory of the pip-installed CUDA compiler tools (``ptxas``), if present."""
    spec = importlib.util.find_spec("nvidia.cuda_nvcc")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        if (Path(location) / "bin" / "ptxas").exists():
            return Path(location)
    return None


def check_available() -> None:
    """Raise :class:`AotUnavailable` with the fix when H100 compiles cannot work here."""
    if importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
        raise AotUnavailable(
            "the CUDA PJRT plugin is not installed; run `make setup` (it installs the "
            "'aot' extra: jax-cuda12-plugin and nvidia-cuda-nvcc-cu12)"
        )
    if find_cuda_dir() is None:
        raise AotUnavailable(
            "ptxas was not found (pip package nvidia-cuda-nvcc-cu12); run `make setup`"
        )


@functools.cache
def h100_topology(num_gpus: int = 8, num_hosts: int = 1) -> Any:
    """A compile-only topology of ``num_hosts`` hosts with ``num_gpus`` H100 SXM GPUs each."""
    if not 1 <= num_gpus <= MAX_GPUS_PER_HOST:
        raise ValueError(
            f"num_gpus must be 1..{MAX_GPUS_PER_HOST} per host, got {num_gpus}; "
            "for more GPUs add hosts with num_hosts"
        )
    if num_hosts < 1:
        raise ValueError(f"num_hosts must be >= 1, got {num_hosts}")
    check_available()
    from jax.experimental import topologies

    return topologies.get_topology_desc(
        platform="cuda",
        target_config=H100_SXM_TARGET,
        topology=f"1x{num_hosts}x{num_gpus}",
    )


def h100_mesh(
    shape: Sequence[int],
    names: Sequence[str],
    num_hosts: int = 1,
    explicit: bool = False,
) -> Any:
    """A mesh of compile-only H100s; ``prod(shape)`` GPUs spread over ``num_hosts`` hosts.

    Axes are ``Auto`` (GSPMD-style propagation) unless ``explicit`` is set.
    """
    import math

    import jax
    from jax.experimental import mesh_utils
    from jax.sharding import AxisType

    if len(shape) != len(names):
        raise ValueError(
            f"mesh shape {tuple(shape)} and axis names {tuple(names)} differ in length"
        )
    total = math.prod(shape)
    if total % num_hosts:
        raise ValueError(
            f"mesh {tuple(shape)} has {total} GPUs, not divisible by {num_hosts} hosts"
        )
    topo = h100_topology(total // num_hosts, num_hosts)
    devices = mesh_utils.create_device_mesh(tuple(shape), list(topo.devices))
    kind = AxisType.Explicit if explicit else AxisType.Auto
    return jax.sharding.Mesh(devices, tuple(names), axis_types=(kind,) * len(names))


def abstract(tree: Any, mesh: Any, spec_fn: Callable[[Any], Any] | Any = None) -> Any:
    """Replace every array in ``tree`` by a ``ShapeDtypeStruct`` sharded on ``mesh``.

    ``spec_fn`` is a PartitionSpec for all leaves, a function ``leaf -> PartitionSpec``, a
    pytree of PartitionSpecs matching ``tree``, or None (replicated).
    """
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    def one(x: Any, spec: Any) -> Any:
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, spec))

    if spec_fn is None:
        spec_fn = PartitionSpec()
    if isinstance(spec_fn, PartitionSpec):
        return jax.tree.map(lambda x: one(x, spec_fn), tree)
    if callable(spec_fn):
        return jax.tree.map(lambda x: one(x, spec_fn(x)), tree)
    return jax.tree.map(one, tree, spec_fn, is_leaf=lambda s: isinstance(s, PartitionSpec))


@dataclasses.dataclass(frozen=True)
class AotResult:
    """A deviceless compile: the compiled object and its optimized, scheduled GPU HLO."""

    compiled: Any
    hlo: str
    num_devices: int


def compile_for_gpu(
    fn: Callable[..., Any],
    *args: Any,
    compiler_options: Mapping[str, str | bool | int | float] | None = None,
    jit_kwargs: Mapping[str, Any] | None = None,
) -> AotResult:
    """Compile ``fn`` for the compile-only GPUs that ``args``' shardings live on.

    ``args`` are ``ShapeDtypeStruct`` trees whose shardings use an :func:`h100_mesh` (see
    :func:`abstract`). ``compiler_options`` are per-compile XLA options: an unknown name
    raises here instead of killing the process, unlike ``XLA_FLAGS``.
    """
    import jax

    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    devices = _devices_of(args)
    if not devices or any(d.platform != "gpu" and "H100" not in d.device_kind for d in devices):
        raise ValueError(
            "compile_for_gpu needs inputs sharded on an H100 mesh: build them with "
            "labkit.gpu_aot.abstract(tree, h100_mesh(...), spec)"
        )
    jitted = fn if hasattr(fn, "lower") and not jit_kwargs else jax.jit(fn, **(jit_kwargs or {}))
    lowered = jitted.lower(*args)
    options = dict(compiler_options or {})
    compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
    return AotResult(compiled, compiled.as_text(), len(devices))


def _devices_of(args: Sequence[Any]) -> set[Any]:
    import jax

    found: set[Any] = set()
    for leaf in jax.tree.leaves(args):
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None:
            found |= set(sharding.device_set)
    return found


def self_test() -> float:
    """Compile a tiny matmul for one H100 and return the seconds it took; raise if it fails."""
    import time

    import jax.numpy as jnp

    start = time.perf_counter()
    mesh = h100_mesh((1,), ("x",))
    x = abstract(jnp.zeros((128, 128), jnp.bfloat16), mesh)
    try:
        result = compile_for_gpu(jnp.matmul, x, x)
    except Exception as exc:  # ptxas, the plugin or the target spec: report, do not hide
        raise AotUnavailable(f"an H100 test compile failed: {type(exc).__name__}: {exc}") from exc
    if "ENTRY" not in result.hlo:
        raise AotUnavailable("an H100 test compile returned no HLO")
    return time.perf_counter() - start
