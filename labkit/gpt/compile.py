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

import functools
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from labkit.core.env import scratch_dir
from labkit.core.timing import Timing, timeit
from labkit.core.types import CompilerOption, CompilerOptions
from labkit.xla import hlo
from labkit.xla.flags import FlagCompile, report_compile, run_compile_child

if TYPE_CHECKING:  # importing the model pulls in JAX; setup() must come first in a subprocess
    import jax
    from jax.sharding import Mesh

    from labkit.gpt.config import GPTConfig
    from labkit.gpt.train import State
    from labkit.parallel.sharding import Strategy
    from labkit.xla.aot import AotResult
    from labkit.xla.tiles import Tiles

# The one option every compile here adds: it leaves the compiled program byte for byte the
# same (tests/test_compile.py checks it) and can only make a deviceless compile cheaper.
# XLA's kernel cache file: a kernel whose fused computation and arguments are the same as one
# compiled before in this process is not sent through LLVM and ptxas again. (The autotuners'
# cache folders, xla_gpu_per_fusion_autotune_cache_dir and
# xla_gpu_experimental_autotuner_cache_dir, stay empty without a GPU: nothing is timed.)
KERNEL_CACHE_OPTION = "xla_gpu_kernel_cache_file"
# The one variant of the H100 program the lessons use, named wherever its numbers appear:
# cuBLAS GEMMs instead of XLA's Triton GEMM fusions, and no fusion autotuner. It compiles
# several times faster here; its collectives and their sizes are the default program's, but
# its kernels (and so what runs between a collective's start and done, and the temp memory)
# are not. `labkit.gpt.compile.variant_difference` shows what changes.
CUBLAS: dict[str, str | bool | int] = {
    "xla_gpu_enable_triton_gemm": False,
    "xla_gpu_experimental_enable_fusion_autotuner": False,
}
VARIANTS: dict[str, dict[str, str | bool | int]] = {"default": {}, "cublas": CUBLAS}
CACHE_SIZE = 64  # compiled programs kept per process (a tiny step's HLO is ~1 MB of text)


@functools.cache
def _cache_folder() -> Path:
    """This process's folder for XLA's kernel cache: a scratch folder, removed at exit (or,
    after a kill, by the next process that asks for one)."""
    return scratch_dir("kernels-")


def kernel_cache_file() -> str:
    """This process's XLA kernel cache file (in :func:`_cache_folder`).

    XLA rewrites the file whole after a compile and takes no lock, so no other process may
    write to it (:func:`compile_with_xla_flags` gives its child a copy).
    """
    return str(_cache_folder() / "kernels.bin")


def same_program_options() -> dict[str, str | bool | int]:
    """Options that leave a deviceless compile's program byte for byte as is (see above)."""
    return {KERNEL_CACHE_OPTION: kernel_cache_file()}


def _key(options: CompilerOptions) -> tuple[tuple[str, CompilerOption], ...]:
    return tuple(sorted((str(k), v) for k, v in options.items()))


def default_mesh(num_gpus: int = 8) -> Mesh:
    """A 1-D ``("data",)`` mesh of ``num_gpus`` compile-only H100s on one host."""
    from labkit.xla.aot import h100_mesh

    return h100_mesh((num_gpus,), ("data",))


def compile_train_step(
    cfg: GPTConfig | str = "tiny",
    strategy: Strategy = "dp",
    compiler_options: CompilerOptions | None = None,
    *,
    batch_size: int = 32,
    mesh: Mesh | None = None,
    variant: str = "default",
    tiles: Tiles | None = None,
) -> AotResult:
    """The GPT train step compiled for ``mesh`` (default: 8 H100s), as an ``AotResult``.

    ``cfg`` is a :class:`~labkit.gpt.config.GPTConfig` or a preset name. ``variant="default"``
    is the program XLA's default flags give for the target (its Triton GEMM tiles chosen by
    ``tiles``, since nothing is autotuned without a GPU); ``"cublas"`` the faster-to-compile
    variant of :data:`CUBLAS`. ``tiles`` picks the Triton GEMM tiles (:mod:`labkit.xla.tiles`; None:
    ``$LABKIT_TILES``, default ``"rule"``). Options that leave the program as is
    (:func:`same_program_options`) are always added. Cached per process on the whole
    configuration (:data:`CACHE_SIZE`), and across processes by the kit's compile cache
    (:mod:`labkit.xla.compile_cache`).
    """
    from labkit.gpt.config import GPTConfig
    from labkit.xla.tiles import default_tiles

    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {sorted(VARIANTS)}")
    cfg, mesh = GPTConfig.of(cfg), mesh if mesh is not None else default_mesh()
    options = {**same_program_options(), **VARIANTS[variant], **(compiler_options or {})}
    chosen = default_tiles() if tiles is None else tiles
    return _compile(cfg, strategy, batch_size, mesh, _key(options), chosen)


@functools.lru_cache(maxsize=CACHE_SIZE)
def _compile(
    cfg: GPTConfig,
    strategy: Strategy,
    batch_size: int,
    mesh: Mesh,
    options: tuple[tuple[str, CompilerOption], ...],
    tiles: Tiles = "untuned",
) -> AotResult:
    from labkit.gpt import train
    from labkit.xla.aot import compile_for_gpu

    step, state, batch = train.train_setup(cfg, mesh, strategy, batch_size)
    return compile_for_gpu(step, state, batch, compiler_options=dict(options), tiles=tiles)


def variant_difference(
    cfg: GPTConfig | str = "tiny", strategy: Strategy = "dp", batch_size: int = 32
) -> list[dict[str, object]]:
    """Rows ``what, default, cublas``: what the cuBLAS variant changes in the H100 program.

    Both compiled for 8 H100s; the same collectives, other kernels, other temp memory, so
    other overlap verdicts and another step by the kit's model (:mod:`labkit.xla.predict`).
    """
    from labkit.xla import overlap, predict
    from labkit.xla.memory import memory

    programs = {
        v: compile_train_step(cfg, strategy, batch_size=batch_size, variant=v) for v in VARIANTS
    }
    facts: dict[str, dict[str, object]] = {}
    for name, result in programs.items():
        kernels = hlo.kernel_counts(result.hlo)
        p = predict.predict(result.hlo)
        verdicts = overlap.verdicts(overlap.estimate(result.hlo))
        facts[name] = {
            "Triton GEMM fusions": kernels.get("kCustom:__triton_nested_gemm_fusion", 0),
            "cuBLAS GEMM calls": sum(n for k, n in kernels.items() if k.startswith("__cublas")),
            "kernels": p.kernels,
            "collectives": hlo.collective_counts(result.hlo),
            "temp MB": round(memory(result.compiled).temp / 1e6, 2),
            "hidden / partly / exposed": "/".join(str(v) for v in verdicts.values()),
            "model's step us": f"{predict.round_sig(p.lower_s * 1e6)}-"
            f"{predict.round_sig(p.upper_s * 1e6)}",
        }
    return [
        {"what": key, **{name: facts[name][key] for name in programs}} for key in facts["default"]
    ]


def gradient_sizes(cfg: GPTConfig | str = "tiny") -> dict[str, int]:
    """Bytes of each gradient of the GPT (one per parameter array), by parameter path."""
    import jax
    from flax import nnx

    from labkit.gpt.config import GPTConfig
    from labkit.gpt.model import GPT

    cfg = GPTConfig.of(cfg)
    abstract = nnx.eval_shape(lambda: GPT(cfg, rngs=nnx.Rngs(0)))
    flat = nnx.to_flat_state(nnx.state(abstract, nnx.Param))
    leaves = {"/".join(map(str, path)): jax.tree.leaves(var)[0] for path, var in flat}
    return {k: int(x.size) * x.dtype.itemsize for k, x in leaves.items()}


# ---------------------------------------------------------------------------------------
# XLA_FLAGS in a subprocess


def compile_with_xla_flags(
    flags: str | Sequence[str],
    cfg: GPTConfig | str = "tiny",
    strategy: Strategy = "dp",
    *,
    batch_size: int = 32,
    compiler_options: CompilerOptions | None = None,
    variant: str = "default",
    timeout_s: float = 600.0,
) -> FlagCompile:
    """:func:`compile_train_step` in a fresh process whose XLA_FLAGS are ``flags``.

    Flags are validated first (:func:`labkit.xla.flags.run_with_flags`): a bad one raises
    ``FlagError`` and nothing starts. This process's XLA_FLAGS never change. The subprocess
    reuses this process's compiled kernels (:func:`kernel_cache_file`).
    """
    from labkit.gpt.config import GPTConfig, config_to_json

    with tempfile.TemporaryDirectory(prefix="labkit-compile-") as tmp:
        kernels = Path(tmp) / "kernels.bin"  # a copy: the child must not write to ours
        for suffix in ("", ".rule"):  # one file per tiles (labkit.xla.aot.kernel_cache_for)
            if Path(kernel_cache_file() + suffix).exists():
                shutil.copyfile(kernel_cache_file() + suffix, f"{kernels}{suffix}")
        options = {KERNEL_CACHE_OPTION: str(kernels), **dict(compiler_options or {})}
        spec = {
            "config": config_to_json(GPTConfig.of(cfg)),
            "strategy": strategy,
            "batch_size": batch_size,
            "compiler_options": options,
            "variant": variant,
        }
        out = Path(tmp) / "step.hlo.txt"
        return run_compile_child(flags, "labkit.gpt.compile", [json.dumps(spec)], out, timeout_s)


def _child(argv: Sequence[str]) -> int:
    """Subprocess side of :func:`compile_with_xla_flags`: compile, write HLO, emit summary."""
    from labkit.core.env import setup
    from labkit.gpt.config import config_from_json

    spec, out = json.loads(argv[0]), Path(argv[1])
    setup(cpu_devices=8, mode="cpu")  # deviceless H100 compiles need no GPU
    result = compile_train_step(
        config_from_json(spec["config"]),
        spec["strategy"],
        spec["compiler_options"],
        batch_size=spec["batch_size"],
        variant=spec["variant"],
    )
    report_compile(result.hlo, out)
    return 0


# ---------------------------------------------------------------------------------------
# Real steps on this machine's devices


def local_train_step(
    cfg: GPTConfig | str = "tiny",
    strategy: Strategy = "dp",
    batch_size: int = 32,
    compiler_options: CompilerOptions | None = None,
    devices: Sequence[jax.Device] | None = None,
    *,
    mesh: Mesh | None = None,
    make_state: Callable[[State], State] | None = None,
) -> tuple[jax.stages.Compiled, State, jax.Array]:
    """``(compiled, state, batch)``: the step on real ``devices`` (default: all), ready to run.

    ``mesh`` replaces the default 1-D ``("data",)`` mesh over ``devices``; ``make_state``
    builds the state from the abstract one (default: an initialised model and optimizer).
    """
    import jax

    from labkit.core.mesh import make_mesh
    from labkit.gpt import data, train
    from labkit.gpt.config import GPTConfig

    cfg = GPTConfig.of(cfg)
    if mesh is None:
        devices = list(devices if devices is not None else jax.devices())
        mesh = make_mesh((len(devices),), ("data",), devices=devices)
    step, abstract, batch_abs = train.train_setup(cfg, mesh, strategy, batch_size)  # cached
    state = (make_state or (lambda a: train.init_train_state(cfg, a)))(abstract)
    tokens = data.batch_at(data.encode(data.corpus(200_000)), 0, batch_size, cfg.seq_len)
    batch = jax.device_put(tokens, batch_abs.sharding)  # (batch, seq_len + 1) int32
    options = dict(compiler_options or {})
    return step.lower(abstract, batch_abs).compile(compiler_options=options), state, batch


def time_steps(
    compiled: jax.stages.Compiled,
    state: State,
    batch: jax.Array,
    repeats: int = 10,
    warmup: int = 2,
) -> Timing:
    """Time ``repeats`` real steps with :func:`labkit.core.timing.timeit`, carrying the state.

    The step donates its state, so it runs on a copy: ``state`` stays usable.
    """
    import jax

    box = {"state": jax.tree.map(lambda x: x.copy(), state)}

    def one() -> jax.Array:
        box["state"], loss = compiled(box["state"], batch)
        return loss

    return timeit(one, warmup=warmup, repeats=repeats)


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
