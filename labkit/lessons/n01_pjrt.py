"""01_pjrt: helpers and exercise checkers of the PJRT and execution-pipeline notebook.

Here: reading which library kernels a compiled program uses, a jaxlib bug reproduced as a
bug report would (:data:`REPRODUCER`), an XLA FFI handler in C++ (RMS normalization) with its
JAX reference, and the exercise checkers.

Run as ``python -m labkit.lessons.n01_pjrt CACHE_DIR``, it is the fresh process of the
persistent-cache experiment: with JAX's persistent compilation cache in ``CACHE_DIR`` it
compiles a data-parallel MLP train step (plain JAX, so the process starts fast) for 8 CPU
devices, then a tiny program for one compile-only H100, and prints the timings, cache hits
and misses and the warnings JAX gave as one JSON line.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import re
import subprocess
import sys
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from labkit.core.feedback import Feedback, check_choice, check_integer, judge, unanswered
from labkit.runtime import pjrt
from labkit.xla import hlo

if TYPE_CHECKING:  # jax is imported where it is used: the cache experiment's process starts fast
    import jax
    from jax.typing import ArrayLike

CACHE_LAYERS = 16  # layers of the MLP step the cache experiment compiles
CACHE_WIDTH = 256  # its width


def kernel_kinds(text: str) -> Counter[str]:
    """Library kernels of a compiled program: the custom entries of :func:`hlo.kernel_counts`.

    GPU: ``__cublas$lt$matmul`` custom calls and ``__triton*`` fusions; CPU: ``__ynn_fusion``
    (YNNPACK, from the XNNPACK project) for dots and reductions. Plain loop fusions are not counted.
    """
    kinds: Counter[str] = Counter()
    for key, count in hlo.kernel_counts(text).items():
        if key.startswith("kCustom:"):  # a custom fusion: "kCustom:<kind>[:<name>]"
            kinds[key.split(":")[1]] += count
        elif not key.startswith("k"):  # a custom call, by target
            kinds[key] += count
    return kinds


def structure(text: str) -> dict[str, int | dict[str, int] | list[str]]:
    """What a compiled program is made of: collectives, async pairs, fusions, and the kinds of
    library kernel it calls (names only: exercise 01.3 counts the CPU program's)."""
    summary = hlo.summary(text)
    return {
        "instructions": summary["instructions"],
        "collectives": summary["collectives"],
        "async pairs": summary["async_pairs"],
        "fusions": sum(summary["fusions"].values()),
        "library kernels": sorted(kernel_kinds(text)),
    }


def gemm_kernels(text: str) -> int:
    """GPU GEMM kernels in compiled HLO: cuBLAS matmul calls plus Triton GEMM fusions."""
    kinds = kernel_kinds(text)
    return sum(n for k, n in kinds.items() if "matmul" in k or "gemm" in k)


# --------------------------------------------------------------------------------------
# A jaxlib bug, reproduced as a bug report would; an XLA FFI handler

# Plain JAX, nothing from the kit: a learner can paste it into a JAX issue as it is.
REPRODUCER = """\
import jax
import jax.numpy as jnp
from jax.experimental.serialize_executable import deserialize_and_load, serialize

jax.config.update("jax_platforms", "cpu")  # the bug is XLA:CPU's
jax.print_environment_info()
x = jnp.ones(4)
compiled = jax.jit(lambda x: x + 1).lower(x).compile()
payload, in_tree, out_tree = serialize(compiled)
loaded = deserialize_and_load(payload, in_tree, out_tree)
print("deserialized:", loaded(x))  # [2. 2. 2. 2.]: a deserialized executable runs
again, _, _ = serialize(loaded)  # serialize the deserialized executable
print(f"serialized {len(payload)} bytes, re-serialized {len(again)} bytes")
print(deserialize_and_load(again, in_tree, out_tree)(x))  # expected [2. 2. 2. 2.]
"""


@dataclasses.dataclass(frozen=True)
class ReproducerRun:
    """What :data:`REPRODUCER` did in a fresh Python process."""

    returncode: int
    stdout: str
    error: str  # the last line of stderr: the exception, as a bug report quotes it

    @property
    def sizes(self) -> tuple[int, int] | None:
        """``(serialized, re-serialized)`` bytes, as the script printed them (None: not reached)."""
        found = re.search(r"serialized (\d+) bytes, re-serialized (\d+) bytes", self.stdout)
        return (int(found[1]), int(found[2])) if found else None

    @property
    def missing_function(self) -> str | None:
        """The kernel function the failed call looked up and did not find (None: no such error)."""
        found = re.search(r"NOT_FOUND: Function (\S+) not found", self.error)
        return found[1] if found else None


def run_reproducer(timeout_s: float = 120) -> ReproducerRun:
    """Run :data:`REPRODUCER` with ``python -c`` in a fresh process, as a bug reporter would."""
    run = subprocess.run(
        [sys.executable, "-c", REPRODUCER],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    lines = run.stderr.strip().splitlines()
    return ReproducerRun(run.returncode, run.stdout, lines[-1] if lines else "")


RMS_NORM_SOURCE = r"""
#include <cmath>
#include <cstdint>
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// y = x / sqrt(mean(x * x over the last axis) + eps), row by row over the leading axes.
static ffi::Error RmsNormImpl(float eps, ffi::Buffer<ffi::F32> x,
                              ffi::ResultBuffer<ffi::F32> y) {
  auto dims = x.dimensions();
  if (dims.size() == 0) return ffi::Error::InvalidArgument("rms_norm needs an array");
  const int64_t n = dims.back();
  const int64_t rows = n == 0 ? 0 : static_cast<int64_t>(x.element_count()) / n;
  const float* in = x.typed_data();
  float* out = y->typed_data();
  for (int64_t r = 0; r < rows; ++r) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum += in[r * n + i] * in[r * n + i];
    const float scale = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
    for (int64_t i = 0; i < n; ++i) out[r * n + i] = in[r * n + i] * scale;
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(RmsNorm, RmsNormImpl,
                              ffi::Ffi::Bind()
                                  .Attr<float>("eps")
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
"""


def build_rms_norm(workdir: str | Path, compiler: str | None = None) -> Path:
    """Compile :data:`RMS_NORM_SOURCE` into ``workdir/librms_norm.so``."""
    return pjrt.build_ffi(RMS_NORM_SOURCE, workdir, "rms_norm", compiler)


def register_rms_norm(
    library: str | Path, name: str = "labkit_rms_norm"
) -> Callable[..., jax.Array]:
    """Register the built handler as FFI target ``name`` (CPU); return ``rms_norm(x, eps)``."""
    import jax
    import numpy as np

    lib = ctypes.cdll.LoadLibrary(str(library))
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(lib.RmsNorm), platform="cpu")

    def rms_norm(x: jax.Array, eps: float = 1e-5) -> jax.Array:
        # (..., n) -> (..., n); under vmap the handler sees the batch as leading rows
        call = jax.ffi.ffi_call(
            name, jax.ShapeDtypeStruct(x.shape, x.dtype), vmap_method="broadcast_all"
        )
        return call(x, eps=np.float32(eps))

    return rms_norm


def rms_norm_reference(x: jax.Array, eps: float = 1e-5) -> jax.Array:
    """The same normalization in plain JAX: ``x / sqrt(mean(x**2, -1) + eps)``."""
    import jax.numpy as jnp

    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)  # (..., n)


# --------------------------------------------------------------------------------------
# Exercise checkers


def check_placement(answer: object, values: ArrayLike, device_index: int = 3) -> Feedback:
    """01.1: ``values`` placed on ``jax.devices()[device_index]`` alone, unchanged."""
    import jax
    import numpy as np

    if unanswered(answer):
        return judge("01.1", answer, False, "", "")
    if not isinstance(answer, jax.Array):
        return Feedback("01.1", False, True, f"expected a jax.Array, got {type(answer).__name__}")
    target = jax.devices()[device_index % len(jax.devices())]
    where = answer.devices()
    passed = where == {target} and bool(np.array_equal(np.asarray(answer), np.asarray(values)))
    return judge(
        "01.1",
        answer,
        passed,
        f"it lives on {target} only, values unchanged.",
        f"it lives on {sorted(d.id for d in where)}; use jax.device_put(values, "
        f"jax.devices()[{device_index}]) and keep the values",
    )


def check_undonated_bytes(answer: object, compiled: jax.stages.Compiled) -> Feedback:
    """01.2: bytes per device of the step's arguments that no output is written over (the
    arguments not donated): ``argument_size_in_bytes - alias_size_in_bytes``."""
    from labkit.xla.memory import memory

    held = memory(compiled)
    expected = held.argument - held.alias
    return check_integer(
        "01.2",
        answer,
        expected,
        f"{expected} bytes: the batch's shard, a new one every step; the state is donated.",
        "which argument is new every step, so nothing is written over it? Its shard per "
        "device: sequences / devices x tokens per sequence x 4 bytes; check with "
        "compiled.memory_analysis() (argument_size_in_bytes - alias_size_in_bytes)",
    )


def check_cpu_library_kernels(answer: object, cpu_hlo: str) -> Feedback:
    """01.3: how many library-kernel fusions (``__ynn_fusion``) the CPU program has."""
    expected = kernel_kinds(cpu_hlo).get("__ynn_fusion", 0)
    return check_integer(
        "01.3",
        answer,
        expected,
        f"{expected}: XLA:CPU hands dots and reductions to YNNPACK kernels.",
        'count fusions with kind=kCustom whose backend_config has "kind":"__ynn_fusion" '
        "(labkit.lessons.n01_pjrt.kernel_kinds does it)",
    )


# --------------------------------------------------------------------------------------
# The fresh process of the persistent-cache experiment


def mlp_train_step(
    params: list[jax.Array], x: jax.Array, y: jax.Array, lr: float = 1e-2
) -> tuple[list[jax.Array], jax.Array]:
    """One SGD step of a tanh MLP in plain JAX (no Flax import: a fresh process starts fast)."""
    import jax
    import jax.numpy as jnp

    def loss_fn(params: list[jax.Array]) -> jax.Array:
        h = x  # (batch, width)
        for w in params:
            h = jnp.tanh(h @ w)  # (batch, width)
        return jnp.mean((h - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return [w - lr * g for w, g in zip(params, grads, strict=True)], loss


def scale_shift(x: jax.Array) -> jax.Array:
    """``2 x + 1``: the tiny program the cache experiment compiles for one compile-only H100."""
    return x * 2 + 1


def _cache_child(argv: list[str]) -> int:
    """Compile :func:`mlp_train_step` (CPU) and :func:`scale_shift` (one compile-only H100)
    with the persistent cache in ``argv[0]``; print the timings as JSON."""
    from labkit.core.env import setup

    setup(cpu_devices=8, mode="cpu")
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec

    from labkit.core.mesh import abstract, make_mesh
    from labkit.xla.aot import h100_mesh

    pjrt.enable_persistent_cache(argv[0])
    mesh = make_mesh((8,), ("data",))
    weight = jax.ShapeDtypeStruct((CACHE_WIDTH, CACHE_WIDTH), jnp.float32)
    params = abstract([weight] * CACHE_LAYERS, mesh)  # replicated
    batch = jax.ShapeDtypeStruct((64, CACHE_WIDTH), jnp.float32)
    x = abstract(batch, mesh, PartitionSpec("data"))  # (batch, width), split over devices
    step = jax.jit(mlp_train_step, donate_argnums=0)
    result = pjrt.timed_compile(lambda: step.lower(params, x, x))
    h100 = abstract(jax.ShapeDtypeStruct((1024,), jnp.float32), h100_mesh((1,), ("gpu",)))
    with warnings.catch_warnings(record=True) as caught:  # kept: the notebook shows them
        warnings.simplefilter("always")
        result["h100"] = pjrt.timed_compile(lambda: jax.jit(scale_shift).lower(h100))
    result["h100"]["warnings"] = [str(w.message) for w in caught]
    print(json.dumps(result))
    return 0


def check_async_program(answer: object, cpu_hlo: str, gpu_hlo: str) -> Feedback:
    """01.p1 (predict): which program runs its all-reduce as an async start/done pair."""
    sides = [
        name
        for name, text in (("cpu", cpu_hlo), ("h100", gpu_hlo))
        if hlo.summary(text)["async_pairs"]
    ]
    expected = {0: "neither", 2: "both"}.get(len(sides)) or sides[0]
    spellings = {"cpu": "cpu", "h100": "h100", "gpu": "h100", "both": "both", "neither": "neither"}
    return check_choice(
        "01.p1",
        answer,
        expected,
        spellings,
        f"{expected}: the next cells show each program's structure.",
        f"not this time ({expected}); the next cells show each program's async pairs",
    )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m labkit.lessons.n01_pjrt CACHE_DIR")
    sys.exit(_cache_child(sys.argv[1:]))
