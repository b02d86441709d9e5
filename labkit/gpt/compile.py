"""The one compile entry of the GPT train step: deviceless H100s, local devices, subprocesses.

:func:`compile_train_step` compiles the step for compile-only H100s (:mod:`labkit.xla.aot`)
and keeps the result in a bounded in-process cache keyed on the *whole* configuration
(``GPTConfig`` with its dtypes, the mesh, strategy, batch size and compiler options), so a
bf16 or FP8 config goes through it like any preset. JAX's persistent cache does not serve
deviceless executables; this cache is what makes a repeated compile free.

Flags reach XLA two ways, neither of which can kill the calling process: per compile
(``compiler_options``) or through ``XLA_FLAGS`` in a fresh subprocess
(:func:`compile_with_xla_flags`) for names that only ``XLA_FLAGS`` takes.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labkit.core.timing import Timing, timeit
from labkit.xla import hlo
from labkit.xla.compare import pipelined

if TYPE_CHECKING:  # importing the model pulls in JAX; setup() must come first in a subprocess
    from labkit.gpt.config import GPTConfig

Options = Mapping[str, str | bool | int]
# Options that make a deviceless compile faster (compile_train_step adds them unless
# fast=False):
# - cuBLAS GEMMs instead of Triton ones: H100 compiles of the tiny step ran ~1.6x faster on 2
#   cores. Collectives and their sizes stay the same; the kernels between start and done differ.
# - no fusion autotuner: without a GPU it cannot time a candidate, yet it compiles them all
#   (about half of a compile here) and then records the default emitter. The program is the
#   same instruction for instruction; only that empty per-fusion record and the module's
#   fingerprint differ (`make bench` prints the time and checks the sameness).
# - LLVM's expensive passes off and ptxas without optimization (CODEGEN): they only change the
#   machine code of kernels that never run here; the HLO is the same byte for byte.
CODEGEN: dict[str, str | bool | int] = {
    "xla_llvm_disable_expensive_passes": True,
    "xla_gpu_disable_gpuasm_optimizations": True,
}
FAST: dict[str, str | bool | int] = {
    "xla_gpu_enable_triton_gemm": False,
    "xla_gpu_experimental_enable_fusion_autotuner": False,
    **CODEGEN,
}
# With fast=True, compiles in one process also share XLA's kernel cache file (a temporary
# file, removed at exit): a kernel whose fused computation and arguments are the same as one
# compiled before is not sent through LLVM and ptxas again. Flag sweeps of one step share most
# kernels; three tiny-step compiles took a third less CPU time. Kernels are keyed by their
# computation's fingerprint, and the HLO is the same byte for byte.
KERNEL_CACHE_OPTION = "xla_gpu_kernel_cache_file"
CACHE_SIZE = 64  # compiled programs kept per process (a tiny step's HLO is ~1 MB of text)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@functools.cache
def kernel_cache_file() -> str:
    """This process's XLA kernel cache file, in a temporary folder removed at exit.

    XLA rewrites the file whole after a compile and takes no lock, so no other process may
    write to it (:func:`compile_with_xla_flags` gives its child a copy). Folders left by
    processes that died without exiting (a killed kernel) are removed once a day old.
    """
    root = Path(tempfile.gettempdir())
    for old in root.glob("labkit-kernels-*"):
        pid = old.name.removeprefix("labkit-kernels-")
        stale = time.time() - old.stat().st_mtime > 86_400
        if pid.isdigit() and int(pid) != os.getpid() and stale and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    folder = root / f"labkit-kernels-{os.getpid()}"
    folder.mkdir(exist_ok=True)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return str(folder / "kernels.bin")


def codegen_options() -> dict[str, str | bool | int]:
    """Options that leave a deviceless compile's HLO as is: :data:`CODEGEN`, shared kernels."""
    return {**CODEGEN, KERNEL_CACHE_OPTION: kernel_cache_file()}


@dataclasses.dataclass(frozen=True)
class FlagCompile:
    """A compile run in a subprocess under ``XLA_FLAGS``: its HLO and numbers."""

    xla_flags: str
    hlo: str
    summary: dict[str, Any]
    seconds: float


def _config(cfg: Any) -> Any:
    from labkit.gpt.config import GPTConfig

    if isinstance(cfg, GPTConfig):
        return cfg
    return GPTConfig.preset(cfg)  # a preset name; unknown names list the valid ones


def _key(options: Options) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((str(k), v) for k, v in options.items()))


def default_mesh(num_gpus: int = 8) -> Any:
    """A 1-D ``("data",)`` mesh of ``num_gpus`` compile-only H100s on one host."""
    from labkit.xla.aot import h100_mesh

    return h100_mesh((num_gpus,), ("data",))


def compile_train_step(
    cfg: Any = "tiny",
    strategy: str = "dp",
    compiler_options: Options | None = None,
    *,
    batch_size: int = 32,
    mesh: Any = None,
    fast: bool = True,
) -> Any:
    """The GPT train step compiled for ``mesh`` (default: 8 H100s), as an ``AotResult``.

    ``cfg`` is a :class:`~labkit.gpt.config.GPTConfig` or a preset name. With ``fast``,
    matmuls become cuBLAS calls (:data:`FAST`) unless the options say otherwise, and kernels
    are shared with earlier compiles of this process (:func:`kernel_cache_file`). Cached per
    process on the whole configuration (:data:`CACHE_SIZE` programs).
    """
    cfg, mesh = _config(cfg), mesh if mesh is not None else default_mesh()
    fast_options = {**FAST, KERNEL_CACHE_OPTION: kernel_cache_file()} if fast else {}
    return _compile(
        cfg, strategy, batch_size, mesh, _key({**fast_options, **(compiler_options or {})})
    )


@functools.lru_cache(maxsize=CACHE_SIZE)
def _compile(
    cfg: GPTConfig, strategy: str, batch_size: int, mesh: Any, options: tuple[tuple[str, Any], ...]
) -> Any:
    from labkit.gpt import train
    from labkit.xla.aot import compile_for_gpu

    step, state, batch = train.train_setup(cfg, mesh, strategy, batch_size)
    return compile_for_gpu(step, state, batch, compiler_options=dict(options))


def gradient_sizes(cfg: Any = "tiny") -> dict[str, int]:
    """Bytes of each gradient of the GPT (one per parameter array), by parameter path."""
    import jax
    from flax import nnx

    from labkit.gpt.model import GPT

    cfg = _config(cfg)
    abstract = nnx.eval_shape(lambda: GPT(cfg, rngs=nnx.Rngs(0)))
    flat = nnx.to_flat_state(nnx.state(abstract, nnx.Param))
    leaves = {"/".join(map(str, path)): jax.tree.leaves(var)[0] for path, var in flat}
    return {k: int(x.size) * x.dtype.itemsize for k, x in leaves.items()}


# ---------------------------------------------------------------------------------------
# XLA_FLAGS in a subprocess


def compile_with_xla_flags(
    flags: str | Sequence[str],
    cfg: Any = "tiny",
    strategy: str = "dp",
    *,
    batch_size: int = 32,
    compiler_options: Options | None = None,
    timeout_s: float = 600.0,
) -> FlagCompile:
    """:func:`compile_train_step` in a fresh process whose XLA_FLAGS are ``flags``.

    Flags are validated first (:func:`labkit.xla.flags.run_with_flags`): a bad one raises
    ``FlagError`` and nothing starts. This process's XLA_FLAGS never change. The subprocess
    reuses this process's compiled kernels (:func:`kernel_cache_file`).
    """
    from labkit.gpt.config import config_to_json
    from labkit.xla.flags import run_with_flags

    with tempfile.TemporaryDirectory(prefix="labkit-compile-") as tmp:
        kernels = Path(tmp) / "kernels.bin"  # a copy: the child must not write to ours
        if Path(kernel_cache_file()).exists():
            shutil.copyfile(kernel_cache_file(), kernels)
        options = {KERNEL_CACHE_OPTION: str(kernels), **dict(compiler_options or {})}
        spec = {
            "config": config_to_json(_config(cfg)),
            "strategy": strategy,
            "batch_size": batch_size,
            "compiler_options": options,
        }
        out = Path(tmp) / "step.hlo.txt"
        run = run_with_flags(
            flags,
            module="labkit.gpt.compile",
            args=[json.dumps(spec), str(out)],
            timeout_s=timeout_s,
        )
        if run.returncode != 0 or run.result is None or not out.exists():
            raise RuntimeError(
                f"the compile under XLA_FLAGS={run.xla_flags!r} failed (exit {run.returncode}):\n"
                f"{run.stderr[-2000:]}"
            )
        text = out.read_text()
    return FlagCompile(run.xla_flags, text, run.result, run.seconds)


def _child(argv: Sequence[str]) -> int:
    """Subprocess side of :func:`compile_with_xla_flags`: compile, write HLO, emit summary."""
    from labkit.core.env import setup
    from labkit.gpt.config import config_from_json
    from labkit.xla.flags import emit

    spec, out = json.loads(argv[0]), Path(argv[1])
    setup(cpu_devices=8, mode="cpu")  # deviceless H100 compiles need no GPU
    result = compile_train_step(
        config_from_json(spec["config"]),
        spec["strategy"],
        spec["compiler_options"],
        batch_size=spec["batch_size"],
    )
    out.write_text(result.hlo)
    emit({**hlo.summary(result.hlo), "pipelined": len(pipelined(result.hlo))})
    return 0


# ---------------------------------------------------------------------------------------
# Real steps on this machine's devices


def local_train_step(
    cfg: Any = "tiny",
    strategy: str = "dp",
    batch_size: int = 32,
    compiler_options: Options | None = None,
    devices: Sequence[Any] | None = None,
    *,
    mesh: Any = None,
    make_state: Callable[[Any], Any] | None = None,
) -> tuple[Any, Any, Any]:
    """``(compiled, state, batch)``: the step on real ``devices`` (default: all), ready to run.

    ``mesh`` replaces the default 1-D ``("data",)`` mesh over ``devices``; ``make_state``
    builds the state from the abstract one (default: an initialised model and optimizer).
    """
    import jax

    from labkit.core.mesh import make_mesh
    from labkit.gpt import data, train

    cfg = _config(cfg)
    if mesh is None:
        devices = list(devices if devices is not None else jax.devices())
        mesh = make_mesh((len(devices),), ("data",), devices=devices)
    step, abstract, batch_abs = train.train_setup(cfg, mesh, strategy, batch_size)  # cached
    state = (make_state or (lambda a: train.init_train_state(cfg, a)))(abstract)
    tokens = data.batch_at(data.encode(data.corpus(200_000)), 0, batch_size, cfg.seq_len)
    batch = jax.device_put(tokens, batch_abs.sharding)  # (batch, seq_len + 1) int32
    options = dict(compiler_options or {})
    return step.lower(abstract, batch_abs).compile(compiler_options=options), state, batch


def time_steps(compiled: Any, state: Any, batch: Any, repeats: int = 10, warmup: int = 2) -> Timing:
    """Time ``repeats`` real steps with :func:`labkit.core.timing.timeit`, carrying the state.

    The step donates its state, so it runs on a copy: ``state`` stays usable.
    """
    import jax

    box = {"state": jax.tree.map(lambda x: x.copy(), state)}

    def one() -> Any:
        box["state"], loss = compiled(box["state"], batch)
        return loss

    return timeit(one, warmup=warmup, repeats=repeats)


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
