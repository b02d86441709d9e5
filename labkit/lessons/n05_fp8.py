"""05_fp8: FP8 GEMMs in the H100 (and B200) program, their traps, FP8 GPT training, checkers.

The FP8 numerics (scaling, the FP8 ``dot_general``, the cuBLASLt scaling modes) live in
:mod:`labkit.numerics.fp8`; kernels' machine code is read with :mod:`labkit.kernels.gpu_code`;
this module runs the notebook's experiments with them.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike

from labkit.core.feedback import Feedback, check_integer, check_number, judge, unanswered
from labkit.core.figures import Picture, Series, log_ticks, new_figure, number, picture, sweep
from labkit.core.mesh import abstract, make_mesh
from labkit.core.types import CompilerOptions, PyTree
from labkit.gpt import data, train
from labkit.gpt.compile import CUBLAS, compile_train_step
from labkit.gpt.config import GPTConfig
from labkit.kernels import gpu_code, pallas
from labkit.numerics import fp8
from labkit.xla.aot import AotResult, compile_for_gpu, gpu_mesh
from labkit.xla.gemms import gemms
from labkit.xla.hlo import instructions
from labkit.xla.tiles import Tiles

if TYPE_CHECKING:
    from flax import linen
    from jax.sharding import Mesh

F8_TARGET = "__cublas$lt$matmul$f8"
DIMS = (((1,), (0,)), ((), ()))  # x (m, k) @ w (k, n)
type Elementwise = Callable[[jax.Array], jax.Array]


def _dequant_dot(
    lhs_scale_shape: tuple[str, ...],
    op: Elementwise | None = None,
    quantize_out: bool = False,
) -> Callable[..., jax.Array]:
    def fn(a: jax.Array, b: jax.Array, sa: jax.Array, sb: jax.Array) -> jax.Array:
        x = a.astype(jnp.float32) * (sa[:, None] if lhs_scale_shape else sa)  # (m, k)
        x = op(x) if op is not None else x
        out = jnp.dot(x, b.astype(jnp.float32) * sb)  # (m, n)
        return fp8.quantize(out, 1.0, fp8.E4M3) if quantize_out else out

    return fn


# name -> (lhs dtype, rhs dtype, lhs scale shape, op between, quantized output)
GEMM_VARIANTS: dict[str, tuple[DTypeLike, DTypeLike, tuple[str, ...], Elementwise | None, bool]] = {
    "scaled e4m3 x e4m3": (fp8.E4M3, fp8.E4M3, (), None, False),
    "scaled e4m3 x e5m2": (fp8.E4M3, fp8.E5M2, (), None, False),
    "scaled, FP8 output": (fp8.E4M3, fp8.E4M3, (), None, True),
    "e5m2 x e5m2": (fp8.E5M2, fp8.E5M2, (), None, False),
    "per-row scale (vector)": (fp8.E4M3, fp8.E4M3, ("m",), None, False),
    "tanh between scale and dot": (fp8.E4M3, fp8.E4M3, (), jnp.tanh, False),
}


def dequant_gemm(
    lhs_dtype: DTypeLike = fp8.E4M3,
    rhs_dtype: DTypeLike = fp8.E4M3,
    lhs_scale_shape: tuple[str, ...] = (),
    op: Elementwise | None = None,
    quantize_out: bool = False,
    n: int = 512,
    options: CompilerOptions | None = None,
    target: str = "H100 SXM",
) -> AotResult:
    """The dequantize -> dot pattern ``(a * sa) @ (b * sb)`` compiled for one GPU.

    ``a`` ``(n, n)`` in ``lhs_dtype``, ``b`` ``(n, n)`` in ``rhs_dtype``, float32 scales
    (``lhs_scale_shape`` ``("m",)``: one per row); ``op`` runs between scaling and the dot.
    ``options`` default to the cuBLAS variant (``labkit.gpt.compile.CUBLAS``): this pattern
    is what XLA's cuBLAS GEMM rewriter matches.
    """
    mesh = gpu_mesh((1,), ("x",), target=target)
    a = abstract(jax.ShapeDtypeStruct((n, n), lhs_dtype), mesh)
    b = abstract(jax.ShapeDtypeStruct((n, n), rhs_dtype), mesh)
    sa = abstract(jax.ShapeDtypeStruct((n,) if lhs_scale_shape else (), jnp.float32), mesh)
    sb = abstract(jax.ShapeDtypeStruct((), jnp.float32), mesh)
    fn = _dequant_dot(lhs_scale_shape, op, quantize_out)
    options = CUBLAS if options is None else options
    return compile_for_gpu(fn, a, b, sa, sb, compiler_options=options)


def gemm_kinds(hlo: str) -> list[str]:
    """``"kernel target: lhs x rhs -> out"`` for each GEMM of a compiled module."""
    return [f"{g.kernel} {g.target}: {g.lhs} x {g.rhs} -> {g.out}" for g in gemms(hlo)]


def _linear(
    dot_general: Callable[..., jax.Array], target: str, shape: tuple[int, int, int]
) -> tuple[Callable[..., PyTree], list[jax.ShapeDtypeStruct]]:
    m, k, n = shape
    mesh = gpu_mesh((1,), ("x",), target=target)
    x = abstract(jax.ShapeDtypeStruct((m, k), jnp.bfloat16), mesh)  # (m, k)
    w = abstract(jax.ShapeDtypeStruct((k, n), jnp.bfloat16), mesh)  # (k, n)

    def loss(x: jax.Array, w: jax.Array) -> jax.Array:
        return dot_general(x, w, DIMS).astype(jnp.float32).sum()

    return jax.value_and_grad(loss, argnums=(0, 1)), [x, w]


def linear_step(
    dot_general: Callable[..., jax.Array],
    target: str = "H100 SXM",
    options: CompilerOptions | None = None,
    shape: tuple[int, int, int] = (256, 256, 256),
) -> AotResult:
    """One bf16 dense layer ``x @ w`` with its gradients in x and w, compiled for one GPU.

    Three GEMMs: the forward one and the two of the backward pass. ``options`` are
    per-compile XLA options (default: none, XLA's default program).
    """
    step, args = _linear(dot_general, target, shape)
    return compile_for_gpu(step, *args, compiler_options=options)


@dataclasses.dataclass(frozen=True)
class PassSearch:
    """A compile with every pass's module dumped: the program, and the pass that removed
    what was searched for (``pipeline / pass``)."""

    result: AotResult
    removed_by: str


def qdq_trap(target: str = "H100 SXM", shape: tuple[int, int, int] = (256, 256, 256)) -> PassSearch:
    """:func:`linear_step` of :data:`labkit.numerics.fp8.qdq_dot_general` (XLA's default
    program), and the XLA pass that removes its FP8 round trip, read from the same compile."""
    step, args = _linear(fp8.qdq_dot_general, target, shape)
    return pass_that_removes(step, *args, needle="f8e4m3fn[")


def pass_that_removes(
    fn: Callable[..., PyTree], *args: PyTree, needle: str, options: CompilerOptions | None = None
) -> PassSearch:
    """Compile ``fn`` and find the XLA pass after which ``needle`` (e.g. ``"f8e4m3fn["``) is
    gone from the module.

    Compiles with every pass's module dumped (``xla_dump_to`` + ``xla_dump_hlo_pass_re``, in
    a temporary folder; dumping leaves the program as it is) and names the first dump
    without it.
    """
    with tempfile.TemporaryDirectory(prefix="labkit-passes-") as folder:
        dumps = {**(options or {}), "xla_dump_to": folder, "xla_dump_hlo_pass_re": ".*"}
        result = compile_for_gpu(fn, *args, compiler_options=dumps)
        files = sorted(Path(folder).glob("module_*.[0-9][0-9][0-9][0-9].*.txt"))
        had = False
        for path in files:
            present = needle in path.read_text()
            if had and not present:
                m = re.search(r"\.\d{4}\.([\w-]+)\.after_([\w-]+)\.", path.name)
                return PassSearch(result, f"{m.group(1)} / {m.group(2)}" if m else path.name)
            had = had or present
    raise ValueError(f"{needle!r} is never removed (or never there) in the compiled passes")


def linear_kernels(
    target: str = "H100 SXM",
    tiles: Tiles | None = None,
    shape: tuple[int, int, int] = (256, 256, 256),
) -> gpu_code.KernelReport:
    """What each GEMM kernel of :func:`linear_step` (``fp8_dot_general``) became: its tiles
    and the tensor-core instructions in its compiled code (:func:`gpu_code.gemm_kernels`)."""
    step, args = _linear(fp8.fp8_dot_general, target, shape)
    return gpu_code.gemm_kernels(step, *args, tiles=tiles)


def gpt_fp8(
    num_layers: int = 1, target: str = "H100 SXM"
) -> tuple[AotResult, gpu_code.KernelReport]:
    """The FP8 GPT's train step (:data:`labkit.numerics.fp8.fp8_dot_general` in every
    ``nnx.Linear``, bf16 compute) compiled for one GPU (XLA's default program with the kit's
    tiles, not autotuned), and its GEMM kernels with their instructions.

    One compile: the kernels are read first, and :func:`gpu_code.gemm_kernels` stores its
    compile (dumps on, the same program) as the plain one, so the step comes from the kit's
    compile cache (twice the compiles with ``LABKIT_COMPILE_CACHE=off``).
    """
    cfg = GPTConfig.preset(
        "tiny", dtype=jnp.bfloat16, num_layers=num_layers, dot_general=fp8.fp8_dot_general
    )
    mesh = gpu_mesh((1,), ("data",), target=target)
    step, state, batch = train.train_setup(cfg, mesh, "dp", 8)
    kernels = gpu_code.gemm_kernels(step, state, batch)
    return compile_train_step(cfg, mesh=mesh, batch_size=8), kernels


def fp8_wgmma_rows(report: gpu_code.KernelReport) -> list[dict[str, str]]:
    """One row per GEMM kernel: its tile config, what it issues and what that multiplies."""
    return [
        {"GEMM": g.fusion, "tiles": g.config, "issues": g.issues, "multiplies": g.multiplies()}
        for g in report.gemms
    ]


def raw_dot_mma(dtype: DTypeLike = fp8.E5M2, tiles: Tiles | None = None) -> list[str]:
    """The tensor-core instructions of :func:`raw_dot_program`'s kernel (one H100), by name."""
    mesh = gpu_mesh((1,), ("x",))
    x = abstract(jax.ShapeDtypeStruct((256, 256), dtype), mesh)

    def fn(a: jax.Array, b: jax.Array) -> jax.Array:
        return jax.lax.dot_general(a, b, DIMS, preferred_element_type=jnp.float32)

    _, code = gpu_code.triton_code(fn, x, x, tiles=tiles)
    return sorted(gpu_code.mma_instructions(code))


def gemm_rows(hlo: str) -> list[dict[str, str]]:
    """One row per GEMM of a compiled module: its kernel and operand types."""
    return [
        {"GEMM": g.name, "kernel": f"{g.kernel} ({g.target})", "operands": f"{g.lhs} x {g.rhs}"}
        for g in gemms(hlo)
    ]


def raw_dot_program(
    dtype: DTypeLike = fp8.E5M2,
    target: str = "H100 SXM",
    options: CompilerOptions | None = None,
    n: int = 256,
) -> AotResult:
    """``dot_general`` of two ``(n, n)`` arrays of ``dtype``, f32 out, compiled for one GPU."""
    mesh = gpu_mesh((1,), ("x",), target=target)
    x = abstract(jax.ShapeDtypeStruct((n, n), dtype), mesh)

    def fn(a: jax.Array, b: jax.Array) -> jax.Array:
        return jax.lax.dot_general(a, b, DIMS, preferred_element_type=jnp.float32)

    return compile_for_gpu(fn, x, x, compiler_options=options)


def e5m2_wgmma(n: int = 256) -> gpu_code.MosaicCode:
    """An e5m2 x e5m2 matmul (:func:`labkit.kernels.pallas.matmul_t`) for an H100: its PTX."""
    mesh = gpu_mesh((1,), ("x",))
    x = abstract(jax.ShapeDtypeStruct((n, n), fp8.E5M2), mesh)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        return gpu_code.mosaic_code(pallas.matmul_t, x, x)


# ---------------------------------------------------------------------------------------
# Block-scaled (MX) FP8


def mx_operands(
    target: str, m: int = 256, k: int = 512, n: int = 256
) -> list[jax.ShapeDtypeStruct]:
    """Abstract MXFP8 operands on one ``target`` GPU: e4m3 a (m, k), b (k, n), e8m0 scales
    per 32 elements along k: (m, k / 32) and (k / 32, n)."""
    mesh = gpu_mesh((1,), ("x",), target=target)
    shapes = [((m, k), fp8.E4M3), ((k, n), fp8.E4M3)]
    shapes += [((m, k // 32), jnp.float8_e8m0fnu), ((k // 32, n), jnp.float8_e8m0fnu)]
    return [abstract(jax.ShapeDtypeStruct(s, d), mesh) for s, d in shapes]


def mx_mma(target: str) -> Counter[str]:
    """The tensor-core instructions of :func:`mx_dot` compiled for one ``target`` GPU.

    XLA's default program makes the ``scaled-dot`` a Triton GEMM fusion; its kernel's code is
    read from the compile's dump (:func:`labkit.kernels.gpu_code.triton_code`).
    """
    _, code = gpu_code.triton_code(mx_dot, *mx_operands(target))
    return gpu_code.mma_instructions(code)


def scaled_dots(hlo: str) -> int:
    """How many ``scaled-dot`` instructions (block-scaled GEMMs) a compiled module holds."""
    return sum(i.opcode == "scaled-dot" for i in instructions(hlo))


def mx_dot(a: jax.Array, b: jax.Array, sa: jax.Array, sb: jax.Array) -> jax.Array:
    """``(a * sa) @ (b * sb)`` with block scales: ``jax.lax.scaled_dot``, bf16 out."""
    return jax.lax.scaled_dot(a, b, lhs_scale=sa, rhs_scale=sb, preferred_element_type=jnp.bfloat16)


def mxfp8_matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a @ b`` through ``jax.nn.scaled_dot_general`` with mxfp8 (block 32, e8m0 scales)."""
    configs = [jax.nn.get_scaled_dot_general_config("mxfp8")] * 3
    return jax.jit(lambda x, y: jax.nn.scaled_dot_general(x, y, DIMS, configs=configs))(a, b)


def mxfp8_program(target: str, n: int = 512, options: CompilerOptions | None = None) -> AotResult:
    """``jax.nn.scaled_dot_general`` (mxfp8, bf16 inputs: the cuDNN path) for one GPU."""
    mesh = gpu_mesh((1,), ("x",), target=target)
    x = abstract(jax.ShapeDtypeStruct((n, n), jnp.bfloat16), mesh)
    configs = [jax.nn.get_scaled_dot_general_config("mxfp8")] * 3

    def fn(a: jax.Array, b: jax.Array) -> jax.Array:
        return jax.nn.scaled_dot_general(
            a, b, DIMS, preferred_element_type=jnp.bfloat16, configs=configs
        )

    return compile_for_gpu(fn, x, x, compiler_options=options)


# ---------------------------------------------------------------------------------------
# flax's FP8 dot_general (Transformer Engine's delayed scaling)


def flax_fp8_dense(features: int = 256) -> linen.Dense:
    """A ``flax.linen.Dense`` whose dot is flax's ``Fp8DirectDotGeneralOp`` (delayed scaling)."""
    from flax import linen
    from flax.linen import fp8_ops

    return linen.Dense(features, use_bias=False, dot_general_cls=fp8_ops.Fp8DirectDotGeneralOp)


def flax_linear_step(
    target: str = "H100 SXM", shape: tuple[int, int, int] = (256, 256, 256)
) -> AotResult:
    """flax's FP8 Dense, forward and gradients, compiled for one GPU (default program)."""
    m, k, n = shape
    dense = flax_fp8_dense(n)
    mesh = gpu_mesh((1,), ("x",), target=target)
    x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    variables = jax.eval_shape(dense.init, jax.random.key(0), x)
    args = abstract((variables, x), mesh)

    def loss(variables: PyTree, x: jax.Array) -> jax.Array:
        out = cast("jax.Array", dense.apply(variables, x))  # no mutable collections: y alone
        return out.astype(jnp.float32).sum()

    return compile_for_gpu(jax.value_and_grad(loss, argnums=(0, 1)), *args)


def worst_row_error(approx: ArrayLike, exact: ArrayLike) -> float:
    """The largest normwise relative error of one row: each row against its own norm."""
    a, e = np.asarray(approx, np.float64), np.asarray(exact, np.float64)  # (m, n)
    return max(fp8.rel_error(a[i], e[i]) for i in range(e.shape[0]))


def per_tensor_matmul(a: ArrayLike, b: ArrayLike) -> jax.Array:
    """``a @ b`` with both operands e4m3, per-tensor current scaling, float32 dot."""
    qa, sa = fp8.quantize_current(a)
    qb, sb = fp8.quantize_current(b)
    return fp8.scaled_dot(qa, qb, sa, sb, compute_dtype=jnp.float32)


# ---------------------------------------------------------------------------------------
# Training


@dataclasses.dataclass(frozen=True)
class Curve:
    """The loss per step of one run, its median wall time per step (first step apart), and,
    when recorded, the amaxes its FP8 matmuls saw in the first step (:func:`amax_rows`)."""

    name: str
    losses: np.ndarray  # (steps,)
    step_s: float
    amaxes: list[dict[str, str | float]] = dataclasses.field(default_factory=list)


def _one_device() -> Mesh:
    return make_mesh((1,), ("data",), devices=jax.devices()[:1])


def initial_state(cfg: GPTConfig, lr: float = 1e-3, seed: int = 0) -> train.State:
    """The GPT's initial params and AdamW state, on the host: one init for several runs.

    Configs that differ only in their ``dot_general`` (bf16, FP8) have the same params, so
    runs started from one initial state start from the same weights.
    """
    tx = train.make_tx(lr)
    _, abstract_state, _ = train.abstract_train_state(cfg, _one_device(), "dp", 1, tx)
    return jax.device_get(train.init_train_state(cfg, abstract_state, tx, seed=seed))


@functools.lru_cache(maxsize=8)
def _train_step(
    cfg: GPTConfig, batch_size: int, lr: float, record_amaxes: bool
) -> tuple[jax.stages.Compiled, train.State, jax.ShapeDtypeStruct]:
    """``(compiled step, abstract state, abstract batch)`` on one device, compiled once per
    process. The step returns ``(state, loss, amaxes by kind)``."""
    recorder = fp8.AmaxRecorder()
    if record_amaxes:
        if cfg.dot_general is not fp8.fp8_dot_general:
            raise ValueError(
                "record_amaxes needs cfg.dot_general=labkit.numerics.fp8.fp8_dot_general "
                f"(its amaxes are recorded), got {cfg.dot_general!r}"
            )
        cfg = dataclasses.replace(cfg, dot_general=recorder.dot_general())
    tx = train.make_tx(lr)
    graphdef, abstract_state, abstract_batch = train.abstract_train_state(
        cfg, _one_device(), "dp", batch_size, tx
    )
    pure_step = train.pure_train_step(graphdef, tx)

    def step(
        state: train.State, batch: jax.Array
    ) -> tuple[train.State, jax.Array, dict[str, list[jax.Array]]]:
        recorder.seen.clear()
        state, loss = pure_step(state, batch)
        seen: dict[str, list[jax.Array]] = {"lhs": [], "rhs": [], "grad": []}
        for kind, value in recorder.seen:  # recorded while tracing: outputs of the step
            seen[kind].append(value)
        return state, loss, seen

    options = train.CPU_STEP_OPTIONS if jax.devices()[0].platform == "cpu" else None
    jitted = jax.jit(step, donate_argnums=0, compiler_options=options)
    return jitted.lower(abstract_state, abstract_batch).compile(), abstract_state, abstract_batch


def train_curve(
    cfg: GPTConfig,
    steps: int,
    batch_size: int,
    seed: int = 0,
    lr: float = 1e-3,
    name: str = "",
    state: train.State | None = None,
    record_amaxes: bool = False,
) -> Curve:
    """Train ``cfg`` for ``steps`` on one device (same batches for a ``seed``).

    ``state``: an :func:`initial_state` to start from (default: a fresh one for ``seed``).
    ``record_amaxes``: also return the amaxes each FP8 matmul saw in the first step, read
    from the train step itself (``cfg.dot_general`` must be
    :data:`labkit.numerics.fp8.fp8_dot_general`).
    The compiled step is kept per process, so a second run of one config compiles nothing.
    """
    compiled, abstract_state, abstract_batch = _train_step(cfg, batch_size, lr, record_amaxes)
    if state is None:
        state = initial_state(cfg, lr, seed)
    # fresh buffers for every run: the step donates them
    state = jax.device_put(state, train.shardings_of(abstract_state))
    tokens, curve, times = data.encode(data.corpus()), [], []
    rows: list[dict[str, str | float]] = []
    for batch in data.batches(tokens, batch_size, cfg.seq_len, seed=seed, steps=steps):
        start = time.perf_counter()
        state, loss, seen = compiled(state, jax.device_put(batch, abstract_batch.sharding))
        curve.append(float(loss))  # waits for the step
        times.append(time.perf_counter() - start)
        if record_amaxes and not rows:
            rows = amax_rows(jax.tree.map(float, seen), cfg.num_layers)
    step_s = float(np.median(times[1:] or times))
    return Curve(name, np.asarray(curve, dtype=np.float64), step_s, rows)


LINEAR_NAMES = ("q", "k", "v", "o", "up", "down")


def amax_rows(seen: dict[str, list[float]], num_layers: int) -> list[dict[str, str | float]]:
    """One row per FP8 matmul, in call order (per block q, k, v, o, up, down, then the head):
    the amaxes of its input, weight and output gradient, and the input's e4m3 and the
    gradient's e5m2 scales. ``seen``: amaxes by kind (``"lhs"``, ``"rhs"``, ``"grad"``), as
    :class:`labkit.numerics.fp8.AmaxRecorder` saw them."""
    names = [f"{blk}.{n}" for blk in range(num_layers) for n in LINEAR_NAMES] + ["head"]
    grads = seen["grad"][::-1]  # the backward pass visits the layers in reverse
    rows: list[dict[str, str | float]] = []
    for i, name in enumerate(names[: len(seen["lhs"])]):
        lhs, rhs, g = seen["lhs"][i], seen["rhs"][i], grads[i]
        rows.append(
            {
                "layer": name,
                "input amax": lhs,
                "weight amax": rhs,
                "grad amax": g,
                "input scale": float(fp8.scale_from_amax(lhs, fp8.E4M3)),
                "grad scale": float(fp8.scale_from_amax(g, fp8.E5M2)),
            }
        )
    return rows


def amax_picture(rows: Sequence[Mapping[str, str | float]]) -> Picture:
    """The amaxes of :func:`amax_rows` per FP8 matmul (log scale): input, weight, gradient."""
    fig, (ax,) = new_figure(size=(9, 3.8))
    names = [str(r["layer"]) for r in rows]
    said = []
    for key, style in (("input amax", "o-"), ("weight amax", "s-"), ("grad amax", "^-")):
        values = [float(r[key]) for r in rows]
        ax.semilogy(range(len(rows)), values, style, label=key)
        said.append(f"{key} {number(min(values))} to {number(max(values))}")
    ax.set_xticks(range(len(rows)), names, rotation=45)
    log_ticks(ax.yaxis)
    ax.set(xlabel="FP8 matmul (block.layer)", ylabel="amax (largest |value|)")
    ax.legend(fontsize=8)
    grads = ", ".join(f"{r['layer']} {number(float(r['grad amax']))}" for r in rows)
    caption = f"Over {len(rows)} FP8 matmuls: {'; '.join(said)}. Gradient amax per matmul: {grads}."
    return picture(fig, "Amax per FP8 matmul, first step of the FP8 run (measured)", caption)


SCALE_DECADES = tuple(range(-10, 7))  # the scale sweep's data: N(0, 1) x 10^d


def scale_sweep(
    decades: Sequence[int] = SCALE_DECADES, size: int = 64, seed: int = 0
) -> dict[str, list[float]]:
    """Relative error of FP8 rounding (:func:`labkit.numerics.fp8.qdq`) of ``size x size``
    N(0, 1) data times ``10^d`` for each decade ``d``: unscaled (saturating cast) and with
    current scaling, in e4m3 and e5m2. One jitted, vmapped call does every case."""
    base = np.random.default_rng(seed).standard_normal((size, size)).astype(np.float32)
    scales = np.power(10.0, np.asarray(decades, np.float64))
    stack = (base[None] * scales[:, None, None]).astype(np.float32)  # (decades, size, size)
    cases = {
        f"{fmt}, {recipe}": (dtype, scaling)
        for fmt, dtype in (("e4m3", fp8.E4M3), ("e5m2", fp8.E5M2))
        for recipe, scaling in (("no scale", "none"), ("current scaling", "current"))
    }

    def every_case(x: jax.Array) -> list[jax.Array]:  # x: (size, size), one decade
        return [fp8.qdq(x, dtype, scaling) for dtype, scaling in cases.values()]

    outs = jax.jit(jax.vmap(every_case))(stack)  # per case: (decades, size, size)
    return {
        name: [fp8.rel_error(o, x) for o, x in zip(np.asarray(out), stack, strict=True)]
        for name, out in zip(cases, outs, strict=True)
    }


def working_decades(
    found: Mapping[str, Sequence[float]],
    fmt: str,
    decades: Sequence[int] = SCALE_DECADES,
    within: float = 2.0,
) -> list[int]:
    """The decades where ``fmt`` unscaled errs at most ``within`` x its current-scaling error."""
    plain, scaled = found[f"{fmt}, no scale"], found[f"{fmt}, current scaling"]
    return [d for d, p, c in zip(decades, plain, scaled, strict=True) if p <= within * c]


def scale_sweep_picture(
    found: Mapping[str, Sequence[float]], decades: Sequence[int] = SCALE_DECADES
) -> Picture:
    """:func:`scale_sweep`'s errors against the data's magnitude, one line per format and recipe."""
    x = [10.0**d for d in decades]
    windows = []
    for fmt in dict.fromkeys(k.split(", ")[0] for k in found):
        works = working_decades(found, fmt, decades)
        span = f"1e{works[0]} to 1e{works[-1]}" if works else "no decade"
        windows.append(f"unscaled {fmt} errs within 2x of current scaling from {span}")
    styles = {"no scale": "o-", "current scaling": "s--"}
    lines = [Series(k, x, list(v), style=styles[k.split(", ")[1]]) for k, v in found.items()]
    return sweep(
        "FP8 rounding error against the data's magnitude",
        "standard deviation of the data (N(0, 1) x scale; log scale)",
        {"relative error (normwise; log scale)": lines},
        xscale="log",
        yscale="log",
        note="Unscaled casts saturate at the format's max (448 e4m3, 57344 e5m2) and flush "
        "below its subnormals; current scaling maps each tensor's amax onto the max: "
        + ", ".join(windows)
        + ".",
    )


# ---------------------------------------------------------------------------------------
# GPU mode: measured


def gemm_tflops(n: int, repeats: int = 10) -> dict[str, float]:
    """Measured TFLOP/s of an ``n x n`` bf16 matmul and of the scaled e4m3 pattern here."""
    from labkit.core.timing import timeit

    key = jax.random.key(0)
    a = jax.random.normal(key, (n, n), jnp.bfloat16)  # (n, n)
    qa, sa = fp8.quantize_current(a)
    bf16 = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.bfloat16))
    f8 = jax.jit(lambda x, y, s, t: fp8.scaled_dot(x, y, s, t))
    flops = 2.0 * n**3
    return {
        "bf16": flops / timeit(bf16, a, a, repeats=repeats).median / 1e12,
        "fp8": flops / timeit(f8, qa, qa, sa, sa, repeats=repeats).median / 1e12,
    }


# ---------------------------------------------------------------------------------------
# Checkers


def round_trip(value: float, amax_value: float, dtype: DTypeLike = fp8.E4M3) -> float:
    """What ``value`` comes back as from a tensor of amax ``amax_value`` quantized to ``dtype``
    with per-tensor current scaling and dequantized."""
    scale = fp8.scale_from_amax(amax_value, dtype)
    return float(fp8.dequantize(fp8.quantize(value, scale, dtype), scale))


def check_round_trip(answer: object, amax_value: float = 3.5, value: float = 0.3) -> Feedback:
    """05.1: what ``value`` in a tensor of amax ``amax_value`` comes back as after e4m3
    current scaling, quantize and dequantize."""
    expected = round_trip(value, amax_value)
    scale = float(fp8.scale_from_amax(amax_value, fp8.E4M3))
    return check_number(
        "05.1",
        answer,
        expected,
        1e-6,
        f"the scale maps the amax {amax_value} onto e4m3's largest value "
        f"(scale = amax / fp8_max = {scale:g}); {value} / scale = {value / scale:g} then "
        "rounds to the nearest e4m3 value (labkit.numerics.precision.grid lists them), and "
        "that times the scale is the answer",
    )


def _op_output(op: Callable[[jax.Array], jax.Array], n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, op(x))`` for a random ``(n, n)`` float32 ``x``, ``op`` jitted."""
    x = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)  # (n, n)
    return x, np.asarray(jax.jit(op)(x))


def check_op_between(answer: object, n: int = 256) -> Feedback:
    """05.2: an op between the scale and the dot (where section 4's ``tanh`` sat) under which
    the scaled pattern still becomes cuBLASLt's FP8 GEMM.

    The checker runs the op on an ``(n, n)`` array (it must keep the shape and change the
    array), then compiles :func:`dequant_gemm` with it for an H100, cuBLAS variant, and reads
    the GEMM.
    """
    if unanswered(answer):
        return judge("05.2", answer, False, "", "")
    if not callable(answer):
        return Feedback(
            "05.2", False, True, f"give a function of one array, got {type(answer).__name__}"
        )
    op = cast("Elementwise", answer)
    try:
        x, y = _op_output(op, n)
    except (TypeError, ValueError) as err:
        return Feedback("05.2", False, True, f"calling it on an ({n}, {n}) array failed: {err}")
    if y.shape != x.shape:
        return Feedback(
            "05.2",
            False,
            True,
            f"it must return an ({n}, {n}) array (the dot's lhs), got {y.shape}",
        )
    if np.array_equal(y, x):
        return Feedback("05.2", False, True, "it returns its input unchanged: give an op that acts")
    found = gemms(dequant_gemm(op=op, n=n).hlo)
    ok = bool(found) and all(g.target == F8_TARGET for g in found)
    got = f"{found[0].target} on {found[0].lhs} operands" if found else "no GEMM"
    return judge(
        "05.2",
        answer,
        ok,
        f"right: it still compiles to {F8_TARGET}. XLA's GEMM rewriter follows an FP8 operand "
        "from the dot back to its convert through a fixed list of ops that move data "
        "(transpose, reshape, bitcast, broadcast, copy, slice, dynamic-slice, pad) or select "
        "it against zero, and applies them to the FP8 data itself; any other op stops it: "
        "one that computes new values (tanh, a negation, x * 2), and even a reverse.",
        f"it compiles to {got}, as tanh did. Which ops only move data, without computing?",
    )


def recovery_step(big_steps: int, history_len: int, big: float = 100.0, small: float = 1.0) -> int:
    """First step whose delayed scale reflects ``small`` again after ``big_steps`` big steps."""
    state = fp8.DelayedScaling.create(history_len)
    target = float(fp8.scale_from_amax(small))
    for t in range(big_steps + history_len + 2):
        if t >= big_steps and np.isclose(float(state.scale), target):
            return t
        state = state.update(jnp.full((4,), big if t < big_steps else small))
    raise RuntimeError("the delayed scale never recovered; check DelayedScaling.update")


def check_recovery(answer: object, big_steps: int = 5, history_len: int = 16) -> Feedback:
    """05.3: the first step whose delayed scale fits small data again after a burst."""
    expected = recovery_step(big_steps, history_len)
    return check_integer(
        "05.3",
        answer,
        expected,
        f"step {expected}: the last big amax (step {big_steps - 1}) leaves a history of "
        f"{history_len} after {history_len} more updates.",
        "the scale of step t uses the amaxes of steps t-history_len .. t-1; when is the "
        "last big one gone? (try labkit.numerics.fp8.DelayedScaling step by step)",
    )


__all__: Sequence[str] = [
    "DIMS",
    "F8_TARGET",
    "GEMM_VARIANTS",
    "Curve",
    "PassSearch",
    "amax_rows",
    "check_op_between",
    "check_recovery",
    "check_round_trip",
    "dequant_gemm",
    "e5m2_wgmma",
    "flax_fp8_dense",
    "flax_linear_step",
    "fp8_wgmma_rows",
    "gemm_kinds",
    "gemm_rows",
    "gemm_tflops",
    "gpt_fp8",
    "initial_state",
    "linear_kernels",
    "linear_step",
    "mx_dot",
    "mx_mma",
    "mx_operands",
    "mxfp8_matmul",
    "mxfp8_program",
    "pass_that_removes",
    "per_tensor_matmul",
    "qdq_trap",
    "raw_dot_mma",
    "raw_dot_program",
    "recovery_step",
    "round_trip",
    "scaled_dots",
    "train_curve",
]


def check_e4m3_cast(answer: object, value: float = 500.0) -> Feedback:
    """05.p1 (predict): what a plain cast of ``value`` to float8_e4m3fn gives ("nan", "inf",
    or a number)."""
    if unanswered(answer):
        return judge("05.p1", answer, False, "", "")
    got = float(jnp.asarray(value, jnp.float32).astype(fp8.E4M3).astype(jnp.float32))
    try:
        said = float(str(answer))  # "nan", "inf" and numbers alike
    except ValueError:
        return Feedback("05.p1", False, True, f"answer a number, 'nan' or 'inf', got {answer!r}")
    same = (np.isnan(got) and np.isnan(said)) or said == got
    return judge(
        "05.p1",
        answer,
        bool(same),
        f"{got}: past 448 a plain cast does not saturate.",
        f"a plain cast gives {got}; the next cells show why",
    )
