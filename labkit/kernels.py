"""Hand-written kernels in Pallas, and attention three ways, for CPU checks and H100 compiles.

Pallas kernels are Python functions over *blocks* of their operands (``BlockSpec``s cut the
arrays; the ``grid`` says how many program instances run). On CPU ``interpret=True`` runs
the same kernel with plain JAX operations, so its numbers can be checked against JAX; for an
H100 ``pl.pallas_call`` lowers to a Triton kernel (a ``__gpu$xla.gpu.triton`` custom call in
the compiled HLO). Lowering for a compile-only H100 needs the mesh of that device as the
*abstract* mesh: :func:`compile_kernel_for_h100` sets it.

Everything here imports JAX lazily, like :mod:`labkit.xla.aot`.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from labkit.core.types import PyTree
from labkit.xla import hlo
from labkit.xla.aot import AotResult, abstract, compile_for_gpu, h100_mesh

H100_SMEM_OPTIN = 232448  # bytes of shared memory one block may opt in to (227 KB, CC 9.0)
TRITON_NUM_STAGES = 3  # Pallas-Triton's default software-pipelining depth
CUDNN_WHEEL = "nvidia-cudnn-cu12"
CUDNN_CALL = re.compile(r"__cudnn\$fmha")

if TYPE_CHECKING:  # JAX is imported lazily
    import jax
    from jax.typing import ArrayLike

# q, k, v of shape (batch, seq, heads, head_dim) -> attention output of the same shape.
type Attention = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


# ---------------------------------------------------------------------------------------
# Kernels


def _matmul_kernel(x_ref: jax.Ref, y_ref: jax.Ref, o_ref: jax.Ref, *, block_k: int) -> None:
    """One (block_m, block_n) output tile: accumulate block_k-wide slices of x and y in f32."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def step(i: jax.Array, acc: jax.Array) -> jax.Array:
        x = x_ref[:, pl.ds(i * block_k, block_k)]  # (block_m, block_k)
        y = y_ref[pl.ds(i * block_k, block_k), :]  # (block_k, block_n)
        return acc + jnp.dot(x, y, preferred_element_type=jnp.float32)

    acc = jnp.zeros(o_ref.shape, jnp.float32)  # (block_m, block_n)
    acc = jax.lax.fori_loop(0, x_ref.shape[1] // block_k, step, acc)
    o_ref[...] = acc.astype(o_ref.dtype)


def matmul(
    x: jax.Array,
    y: jax.Array,
    block_m: int = 64,
    block_n: int = 64,
    block_k: int = 32,
    *,
    num_stages: int | None = None,
    interpret: bool = False,
) -> jax.Array:
    """``x @ y`` as a Pallas kernel: one program per (block_m, block_n) tile, a loop over K."""
    import jax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as pltriton

    (m, k), (k2, n) = x.shape, y.shape
    for name, size, block in (("M", m, block_m), ("N", n, block_n), ("K", k, block_k)):
        if size % block:
            raise ValueError(
                f"{name}={size} is not a multiple of its block {block}; pick a divisor"
            )
    if k != k2:
        raise ValueError(f"inner sizes differ: x is {x.shape}, y is {y.shape}")
    params = None if num_stages is None else pltriton.CompilerParams(num_stages=num_stages)
    return pl.pallas_call(
        functools.partial(_matmul_kernel, block_k=block_k),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // block_m, n // block_n),
        in_specs=[
            pl.BlockSpec((block_m, k), lambda i, j: (i, 0)),  # a row band of x
            pl.BlockSpec((k, block_n), lambda i, j: (0, j)),  # a column band of y
        ],
        out_specs=pl.BlockSpec((block_m, block_n), lambda i, j: (i, j)),
        compiler_params=params,
        interpret=interpret,
    )(x, y)


def blocked_reference(x: jax.Array, y: jax.Array, block_k: int = 32) -> jax.Array:
    """What :func:`matmul` computes, in plain JAX and in its order: f32 sums of K-blocks."""
    import jax.numpy as jnp

    acc = jnp.zeros((x.shape[0], y.shape[1]), jnp.float32)
    for i in range(0, x.shape[1], block_k):
        acc = acc + jnp.dot(
            x[:, i : i + block_k], y[i : i + block_k], preferred_element_type=jnp.float32
        )
    return acc.astype(x.dtype)


def matmul_smem_bytes(
    block_m: int, block_n: int, block_k: int, itemsize: int = 2, num_stages: int = TRITON_NUM_STAGES
) -> int:
    """Shared memory a Triton matmul tile asks for: one x and one y slice per pipeline stage."""
    return num_stages * (block_m * block_k + block_k * block_n) * itemsize


def _softmax_kernel(x_ref: jax.Ref, o_ref: jax.Ref) -> None:
    """Softmax over the last axis of a (block_rows, n) block, in f32: one read, one write."""
    import jax.numpy as jnp

    x = x_ref[...].astype(jnp.float32)  # (block_rows, n)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


def softmax(x: jax.Array, block_rows: int = 16, *, interpret: bool = False) -> jax.Array:
    """Row softmax of a 2-D array, fused into one Pallas kernel (whole rows per block)."""
    import jax
    from jax.experimental import pallas as pl

    rows, n = x.shape
    if rows % block_rows:
        raise ValueError(f"{rows} rows are not a multiple of block_rows={block_rows}")
    return pl.pallas_call(
        _softmax_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(rows // block_rows,),
        in_specs=[pl.BlockSpec((block_rows, n), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((block_rows, n), lambda i: (i, 0)),
        interpret=interpret,
    )(x)


def softmax_reference(x: jax.Array) -> jax.Array:
    """The same arithmetic in plain JAX: f32 max-subtracted exponentials over their sum."""
    import jax.numpy as jnp

    x32 = x.astype(jnp.float32)
    e = jnp.exp(x32 - jnp.max(x32, axis=-1, keepdims=True))
    return (e / jnp.sum(e, axis=-1, keepdims=True)).astype(x.dtype)


def _flash_kernel(
    q_ref: jax.Ref, k_ref: jax.Ref, v_ref: jax.Ref, o_ref: jax.Ref, *, block_k: int
) -> None:
    """Causal attention for one (block_q, head_dim) query block: online softmax over key blocks.

    Never holds more than a (block_q, block_k) tile of scores; ``m`` (row max) and ``l`` (row
    sum of exponentials) rescale the running output when a later block raises the max.
    """
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    q = q_ref[...]  # (block_q, head_dim)
    block_q, head_dim = q.shape
    rows = pl.program_id(2) * block_q + jnp.arange(block_q)  # query positions

    type Carry = tuple[jax.Array, jax.Array, jax.Array]  # row max, row sum, output (f32)

    def step(j: jax.Array, carry: Carry) -> Carry:
        m, total, acc = carry
        k = k_ref[pl.ds(j * block_k, block_k), :]  # (block_k, head_dim)
        v = v_ref[pl.ds(j * block_k, block_k), :]
        s = jnp.dot(q, k.T, preferred_element_type=jnp.float32) / math.sqrt(head_dim)
        cols = j * block_k + jnp.arange(block_k)  # key positions
        s = jnp.where(rows[:, None] >= cols[None, :], s, -jnp.inf)  # (block_q, block_k)
        m_new = jnp.maximum(m, s.max(axis=-1))
        p = jnp.exp(s - m_new[:, None])
        scale = jnp.exp(m - m_new)  # shrinks what was summed under the old max
        total = total * scale + p.sum(axis=-1)
        acc = acc * scale[:, None] + jnp.dot(
            p.astype(v.dtype), v, preferred_element_type=jnp.float32
        )
        return m_new, total, acc

    init = (
        jnp.full((block_q,), -jnp.inf, jnp.float32),
        jnp.zeros((block_q,), jnp.float32),
        jnp.zeros((block_q, head_dim), jnp.float32),
    )
    _, total, acc = jax.lax.fori_loop(0, k_ref.shape[0] // block_k, step, init)
    o_ref[...] = (acc / total[:, None]).astype(o_ref.dtype)


def flash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    block_q: int = 32,
    block_k: int = 32,
    *,
    interpret: bool = False,
) -> jax.Array:
    """Causal attention of (batch, seq, heads, head_dim) inputs with a Pallas flash kernel."""
    import jax
    from jax.experimental import pallas as pl

    batch, seq, heads, head_dim = q.shape
    if seq % block_q or seq % block_k:
        raise ValueError(f"seq={seq} must be a multiple of block_q={block_q} and block_k={block_k}")
    sq = pl.squeezed  # a block dimension of size 1, dropped inside the kernel
    block = pl.BlockSpec((sq, block_q, sq, head_dim), lambda b, h, i: (b, i, h, 0))
    whole = pl.BlockSpec((sq, seq, sq, head_dim), lambda b, h, i: (b, 0, h, 0))  # all keys
    return pl.pallas_call(
        functools.partial(_flash_kernel, block_k=block_k),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(batch, heads, seq // block_q),
        in_specs=[block, whole, whole],
        out_specs=block,
        interpret=interpret,
    )(q, k, v)  # (batch, seq, heads, head_dim)


def plain_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal attention as a JAX user writes it: the full (batch, heads, seq, seq) scores."""
    import jax
    import jax.numpy as jnp

    seq, head_dim = q.shape[1], q.shape[3]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)  # (batch, heads, seq, seq)
    s = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), s, -jnp.inf)
    p = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(q.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal attention through cuDNN's fused kernel (GPU only: ``implementation="cudnn"``)."""
    import jax

    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")


def with_grad(
    attention: Attention,
) -> Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]:
    """Forward and backward: the gradient of ``sum(attention(q, k, v))`` in q, k and v."""
    import jax
    import jax.numpy as jnp

    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return attention(q, k, v).astype(jnp.float32).sum()

    return jax.grad(loss, argnums=(0, 1, 2))


# ---------------------------------------------------------------------------------------
# Compiling for one H100, and reading the programs


def compile_kernel_for_h100(
    fn: Callable[..., PyTree],
    *arrays: jax.Array | jax.ShapeDtypeStruct,
    **options: str | bool | int | float,
) -> AotResult:
    """Compile ``fn(*arrays)`` for one compile-only H100, Pallas kernels included.

    ``arrays`` give shapes and dtypes (arrays or ShapeDtypeStructs). Pallas lowers only
    when the H100 mesh is the abstract mesh, so it is set around the compile.
    """
    import jax

    mesh = h100_mesh((1,), ("x",))
    args = [abstract(a, mesh) for a in arrays]
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        return compile_for_gpu(fn, *args, compiler_options=options or None)


def cudnn_installed() -> str | None:
    """The installed ``nvidia-cudnn-cu12`` version when its library is present, else None.

    XLA needs that library to build cuDNN attention calls, even for a compile-only GPU.
    """
    from pathlib import Path

    try:
        version = importlib.metadata.version(CUDNN_WHEEL)
        spec = importlib.util.find_spec("nvidia.cudnn")
    except (importlib.metadata.PackageNotFoundError, ModuleNotFoundError):
        return None
    paths = list(spec.submodule_search_locations or []) if spec else []
    return version if any((Path(p) / "lib" / "libcudnn.so.9").exists() for p in paths) else None


def score_buffers(text: str, batch: int, heads: int, seq: int) -> list[tuple[str, int]]:
    """Kernel results shaped like the score matrix, (batch, heads, seq, seq): (dtype, bytes).

    Only top-level kernels (entry computation) count: those results are written to HBM.
    """
    dims = [batch, heads, seq, seq]
    found = []
    for inst in hlo.entry_computation(text):
        if inst.opcode in ("parameter", "bitcast", "tuple", "get-tuple-element"):
            continue
        for dtype, shape in re.findall(r"(\w+)\[([\d,]*)\]", inst.shape):
            if [int(d) for d in shape.split(",") if d] == dims:
                found.append((dtype, hlo.shape_bytes(f"{dtype}[{shape}]")))
    return found


# A Mosaic GPU kernel's memory reference: a jax.Ref when the kernel runs, but plgpu's functions
# annotate it with JAX's internal AbstractRef, which no public type matches.
type MosaicRef = Any


def mosaic_scale(x: jax.Array, factor: float = 2.0) -> jax.Array:
    """``x * factor`` as a Mosaic GPU kernel: explicit copies HBM -> SMEM -> HBM, one barrier.

    Mosaic GPU (``plgpu.kernel``) is Pallas's lower-level Hopper backend: the kernel moves
    data itself (TMA copies, barriers) instead of BlockSpecs doing it. GPU-only.
    """
    import jax
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def body(
        x_hbm: MosaicRef, o_hbm: MosaicRef, x_smem: MosaicRef, o_smem: MosaicRef, barrier: MosaicRef
    ) -> None:
        plgpu.copy_gmem_to_smem(x_hbm, x_smem, barrier)  # an async copy (TMA)
        plgpu.barrier_wait(barrier)
        o_smem[...] = x_smem[...] * factor
        plgpu.commit_smem()  # make the SMEM writes visible to the copy engine
        plgpu.copy_smem_to_gmem(o_smem, o_hbm)
        plgpu.wait_smem_to_gmem(0)

    smem = plgpu.SMEM(x.shape, x.dtype)
    return plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_types=[smem, smem, plgpu.Barrier(num_arrivals=1)],
    )(x)


def requested_smem(message: str) -> int | None:
    """The bytes a kernel asked for, from XLA's 'Shared memory size limit exceeded' error."""
    m = re.search(r"requested (\d+)", message)
    return int(m.group(1)) if m else None


def ulps(a: ArrayLike, b: ArrayLike) -> int:
    """Largest distance between two float arrays in units in the last place of ``b``'s dtype."""
    import jax.numpy as jnp
    import numpy as np

    eps = float(jnp.finfo(jnp.asarray(b).dtype).eps)  # spacing of numbers in [1, 2)
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    tiny = float(jnp.finfo(jnp.asarray(b).dtype).tiny)
    spacing = eps * np.exp2(np.floor(np.log2(np.maximum(np.abs(b64), tiny))))
    return int(np.max(np.round(np.abs(a64 - b64) / spacing)))
