"""Causal flash attention as Pallas Mosaic GPU kernels: forward, backward, and the blocks visited.

Three ``plgpu.kernel`` s, one warpgroup (4 warps) per program, Hopper ``wgmma`` for every
product, q, k and v of shape (batch, seq, heads, head_dim):

- **forward** (:func:`forward`): one program per (batch, head, block of ``BLOCK`` queries)
  walks the key blocks with an *online softmax* (running row max ``m`` and row sum ``l``);
  under the causal mask a query block needs only the key blocks at or left of its own, so
  the loop stops at the diagonal and the fully masked blocks are never read. It also writes
  the rows' log-sum-exp (``lse``) for the backward pass, and how many key blocks each row's
  program visited (:func:`forward` ``with_visits``);
- **backward**: ``dq`` (one program per query block, the key blocks up to the diagonal) and
  ``dk``/``dv`` (one program per key block, the query blocks from the diagonal on), from
  the saved ``lse`` and ``delta = rowsum(o * do)`` (computed by XLA), as FlashAttention-2;
- :func:`flash_attention`: both joined by a ``jax.custom_vjp``, so ``jax.grad`` works.

On a CPU every kernel runs in Mosaic GPU's interpret mode (:data:`INTERPRET`), which
simulates shared memory, the asynchronous copies and the barriers; compiled for an H100
(:mod:`labkit.kernels.pallas` ``compile_kernel_for_gpu``) each is one ``mosaic_gpu_v2`` custom call.
Block sizes are fixed teaching values (64: the rows of one ``wgmma``), not tuned, and the
kernels do not pipeline their copies.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from labkit.kernels.pallas import MosaicRef, interpret_params, swizzled_smem

if TYPE_CHECKING:  # JAX is imported lazily, like labkit.xla.aot
    import jax

BLOCK = 64  # queries or keys per program and per loop step: one warpgroup's wgmma rows
HEAD_DIMS = (64, 128)  # a 128-byte (bf16) swizzled row: what the shared-memory tiles assume


def _check(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[int, int, int, int]:
    import jax.numpy as jnp

    if q.shape != k.shape or q.shape != v.shape or q.ndim != 4:
        raise ValueError(
            f"q, k, v must share one (batch, seq, heads, head_dim) shape, got "
            f"{q.shape}, {k.shape}, {v.shape}"
        )
    batch, seq, heads, head_dim = q.shape
    if seq % BLOCK or head_dim not in HEAD_DIMS:
        raise ValueError(
            f"seq={seq} must be a multiple of {BLOCK} and head_dim={head_dim} one of "
            f"{HEAD_DIMS} (wgmma rows and a 128-byte shared-memory row); pad or pick a preset "
            "with such heads"
        )
    if not (q.dtype == k.dtype == v.dtype == jnp.bfloat16):
        raise ValueError(f"q, k, v must be bfloat16, got {q.dtype}, {k.dtype}, {v.dtype}")
    return batch, seq, heads, head_dim


def _product(a: MosaicRef, b: MosaicRef, shape: tuple[int, int]) -> jax.Array:
    """``a @ b`` of two shared-memory tiles with one wgmma, into a fresh f32 accumulator."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def run(acc_ref: MosaicRef) -> jax.Array:
        plgpu.wgmma(acc_ref, a, b)
        return acc_ref[...]  # waits for the wgmma

    return pl.run_scoped(run, plgpu.ACC(shape, jnp.float32))


def kv_blocks_visited(seq: int, causal: bool = True) -> list[int]:
    """Key blocks the forward kernel reads for each query block: up to the diagonal if causal."""
    blocks = seq // BLOCK
    return [i + 1 if causal else blocks for i in range(blocks)]


# ---------------------------------------------------------------------------------------
# Forward


def _forward_kernel(
    q_ref: MosaicRef,
    k_ref: MosaicRef,
    v_ref: MosaicRef,
    o_ref: MosaicRef,
    lse_ref: MosaicRef,
    visits_ref: MosaicRef,
    q_smem: MosaicRef,
    k_smem: MosaicRef,
    v_smem: MosaicRef,
    p_smem: MosaicRef,
    row_smem: MosaicRef,
    barrier: MosaicRef,
    *,
    scale: float,
) -> None:
    """One (batch, head, query block): online softmax over key blocks 0 .. the diagonal."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b, h, i = (jax.lax.axis_index(n) for n in ("batch", "heads", "q_block"))
    rows = (b, pl.ds(i * BLOCK, BLOCK), h)  # this program's queries
    plgpu.copy_gmem_to_smem(q_ref.at[rows], q_smem, barrier)
    plgpu.barrier_wait(barrier)
    wgmma, row = plgpu.Layout.WGMMA, plgpu.Layout.WGMMA.reduce(1)
    head_dim = q_smem.shape[-1]

    def step(j: jax.Array, carry: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        acc, m, total = carry  # (BLOCK, head_dim) f32; (BLOCK,) row max; (BLOCK,) row sum
        keys = (b, pl.ds(j * BLOCK, BLOCK), h)
        plgpu.copy_gmem_to_smem(k_ref.at[keys], k_smem, barrier)
        plgpu.barrier_wait(barrier)
        plgpu.copy_gmem_to_smem(v_ref.at[keys], v_smem, barrier)
        plgpu.barrier_wait(barrier)

        s = _product(q_smem, k_smem.transpose((1, 0)), (BLOCK, BLOCK)) * scale
        q_pos = plgpu.broadcasted_iota(jnp.int32, (BLOCK, BLOCK), 0, layout=wgmma) + i * BLOCK
        k_pos = plgpu.broadcasted_iota(jnp.int32, (BLOCK, BLOCK), 1, layout=wgmma) + j * BLOCK
        s = jnp.where(q_pos >= k_pos, s, -jnp.inf)  # only the diagonal block masks anything
        m_new = jnp.maximum(m, s.max(axis=1))
        p = jnp.exp(s - jax.lax.broadcast_in_dim(m_new, s.shape, [0]))
        alpha = jnp.exp(m - m_new)  # shrinks what was summed under the old max
        total = total * alpha + p.sum(axis=1)
        acc = acc * jax.lax.broadcast_in_dim(alpha, acc.shape, [0])

        p_smem[...] = p.astype(p_smem.dtype)  # wgmma reads its left operand from SMEM here
        plgpu.commit_smem()
        acc = acc + _product(p_smem, v_smem, (BLOCK, head_dim))
        return acc, m_new, total

    init = (
        plgpu.layout_cast(jnp.zeros((BLOCK, head_dim), jnp.float32), wgmma),
        plgpu.layout_cast(jnp.full((BLOCK,), -jnp.inf, jnp.float32), row),
        plgpu.layout_cast(jnp.zeros((BLOCK,), jnp.float32), row),
    )
    acc, m, total = jax.lax.fori_loop(0, i + 1, step, init)  # causal: stop at the diagonal
    q_smem[...] = (acc / jax.lax.broadcast_in_dim(total, acc.shape, [0])).astype(q_smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(q_smem, o_ref.at[rows])
    plgpu.wait_smem_to_gmem(0)
    for ref, value in ((lse_ref, m + jnp.log(total)), (visits_ref, (i + 1) + 0.0 * m)):
        row_smem[...] = value  # (BLOCK,) per query row: log-sum-exp, key blocks visited
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(row_smem, ref.at[b, h, pl.ds(i * BLOCK, BLOCK)])
        plgpu.wait_smem_to_gmem(0)


def forward(
    q: jax.Array, k: jax.Array, v: jax.Array, *, interpret: bool = False
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(o, lse, visits)``: causal attention, each row's log-sum-exp, key blocks per row.

    ``o`` is (batch, seq, heads, head_dim) bf16; ``lse`` and ``visits`` are (batch, heads,
    seq) float32 (``visits[b, h, r]`` = key blocks the program of row ``r`` read).
    """
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas import mosaic_gpu as plgpu

    batch, seq, heads, head_dim = _check(q, k, v)
    row_type = jax.ShapeDtypeStruct((batch, heads, seq), jnp.float32)
    kernel = plgpu.kernel(
        functools.partial(_forward_kernel, scale=1 / math.sqrt(head_dim)),
        out_type=(jax.ShapeDtypeStruct(q.shape, q.dtype), row_type, row_type),
        scratch_types=[
            swizzled_smem((BLOCK, head_dim), q.dtype),  # q, then o
            swizzled_smem((BLOCK, head_dim), q.dtype),  # k block
            swizzled_smem((BLOCK, head_dim), q.dtype),  # v block
            swizzled_smem((BLOCK, BLOCK), q.dtype),  # probabilities, the left operand of p @ v
            plgpu.SMEM((BLOCK,), jnp.float32),  # a per-row vector on its way out
            plgpu.Barrier(num_arrivals=1),
        ],
        grid=(batch, heads, seq // BLOCK),
        grid_names=("batch", "heads", "q_block"),
        interpret=interpret_params(interpret),
    )
    return kernel(q, k, v)


# ---------------------------------------------------------------------------------------
# Backward


def _dq_kernel(
    q_ref: MosaicRef,
    k_ref: MosaicRef,
    v_ref: MosaicRef,
    do_ref: MosaicRef,
    lse_ref: MosaicRef,
    delta_ref: MosaicRef,
    dq_ref: MosaicRef,
    q_smem: MosaicRef,
    do_smem: MosaicRef,
    k_smem: MosaicRef,
    v_smem: MosaicRef,
    ds_smem: MosaicRef,
    lse_smem: MosaicRef,
    delta_smem: MosaicRef,
    barrier: MosaicRef,
    *,
    scale: float,
) -> None:
    """dq of one query block: ``sum_j dS_ij k_j`` over key blocks 0 .. the diagonal."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b, h, i = (jax.lax.axis_index(n) for n in ("batch", "heads", "q_block"))
    rows = (b, pl.ds(i * BLOCK, BLOCK), h)
    vec = (b, h, pl.ds(i * BLOCK, BLOCK))
    for src, dst in ((q_ref.at[rows], q_smem), (do_ref.at[rows], do_smem)):
        plgpu.copy_gmem_to_smem(src, dst, barrier)
        plgpu.barrier_wait(barrier)
    for src, dst in ((lse_ref.at[vec], lse_smem), (delta_ref.at[vec], delta_smem)):
        plgpu.copy_gmem_to_smem(src, dst, barrier)
        plgpu.barrier_wait(barrier)
    wgmma, row = plgpu.Layout.WGMMA, plgpu.Layout.WGMMA.reduce(1)
    lse, delta = plgpu.load(lse_smem, layout=row), plgpu.load(delta_smem, layout=row)
    head_dim = q_smem.shape[-1]

    def step(j: jax.Array, dq: jax.Array) -> jax.Array:
        keys = (b, pl.ds(j * BLOCK, BLOCK), h)
        for src, dst in ((k_ref.at[keys], k_smem), (v_ref.at[keys], v_smem)):
            plgpu.copy_gmem_to_smem(src, dst, barrier)
            plgpu.barrier_wait(barrier)

        s = _product(q_smem, k_smem.transpose((1, 0)), (BLOCK, BLOCK)) * scale
        q_pos = plgpu.broadcasted_iota(jnp.int32, (BLOCK, BLOCK), 0, layout=wgmma) + i * BLOCK
        k_pos = plgpu.broadcasted_iota(jnp.int32, (BLOCK, BLOCK), 1, layout=wgmma) + j * BLOCK
        p = jnp.where(q_pos >= k_pos, jnp.exp(s - jax.lax.broadcast_in_dim(lse, s.shape, [0])), 0.0)
        dp = _product(do_smem, v_smem.transpose((1, 0)), (BLOCK, BLOCK))  # dO V^T
        ds = p * (dp - jax.lax.broadcast_in_dim(delta, s.shape, [0]))
        ds_smem[...] = ds.astype(ds_smem.dtype)
        plgpu.commit_smem()
        return dq + _product(ds_smem, k_smem, (BLOCK, head_dim))

    dq = plgpu.layout_cast(jnp.zeros((BLOCK, head_dim), jnp.float32), wgmma)
    dq = jax.lax.fori_loop(0, i + 1, step, dq)
    q_smem[...] = (dq * scale).astype(q_smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[rows])
    plgpu.wait_smem_to_gmem(0)


def _dkv_kernel(
    q_ref: MosaicRef,
    k_ref: MosaicRef,
    v_ref: MosaicRef,
    do_ref: MosaicRef,
    lse_ref: MosaicRef,
    delta_ref: MosaicRef,
    dk_ref: MosaicRef,
    dv_ref: MosaicRef,
    k_smem: MosaicRef,
    v_smem: MosaicRef,
    q_smem: MosaicRef,
    do_smem: MosaicRef,
    pt_smem: MosaicRef,
    ds_smem: MosaicRef,
    lse_smem: MosaicRef,
    delta_smem: MosaicRef,
    barrier: MosaicRef,
    *,
    scale: float,
) -> None:
    """dk, dv of one key block, over query blocks from the diagonal to the end (transposed)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b, h, j = (jax.lax.axis_index(n) for n in ("batch", "heads", "k_block"))
    keys = (b, pl.ds(j * BLOCK, BLOCK), h)
    for src, dst in ((k_ref.at[keys], k_smem), (v_ref.at[keys], v_smem)):
        plgpu.copy_gmem_to_smem(src, dst, barrier)
        plgpu.barrier_wait(barrier)
    wgmma, col = plgpu.Layout.WGMMA, plgpu.Layout.WGMMA.reduce(0)
    head_dim = k_smem.shape[-1]

    def step(i: jax.Array, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        dk, dv = carry
        rows = (b, pl.ds(i * BLOCK, BLOCK), h)
        vec = (b, h, pl.ds(i * BLOCK, BLOCK))
        for src, dst in ((q_ref.at[rows], q_smem), (do_ref.at[rows], do_smem)):
            plgpu.copy_gmem_to_smem(src, dst, barrier)
            plgpu.barrier_wait(barrier)
        for src, dst in ((lse_ref.at[vec], lse_smem), (delta_ref.at[vec], delta_smem)):
            plgpu.copy_gmem_to_smem(src, dst, barrier)
            plgpu.barrier_wait(barrier)
        lse, delta = plgpu.load(lse_smem, layout=col), plgpu.load(delta_smem, layout=col)

        st = (
            _product(k_smem, q_smem.transpose((1, 0)), (BLOCK, BLOCK)) * scale
        )  # (keys, queries): S transposed
        k_pos = plgpu.broadcasted_iota(jnp.int32, (BLOCK, BLOCK), 0, layout=wgmma) + j * BLOCK
        q_pos = plgpu.broadcasted_iota(jnp.int32, (BLOCK, BLOCK), 1, layout=wgmma) + i * BLOCK
        pt = jnp.where(
            q_pos >= k_pos, jnp.exp(st - jax.lax.broadcast_in_dim(lse, st.shape, [1])), 0.0
        )
        dpt = _product(v_smem, do_smem.transpose((1, 0)), (BLOCK, BLOCK))  # V dO^T
        dst = pt * (dpt - jax.lax.broadcast_in_dim(delta, st.shape, [1]))
        pt_smem[...] = pt.astype(pt_smem.dtype)
        ds_smem[...] = dst.astype(ds_smem.dtype)
        plgpu.commit_smem()
        dv = dv + _product(pt_smem, do_smem, (BLOCK, head_dim))  # P^T dO
        dk = dk + _product(ds_smem, q_smem, (BLOCK, head_dim))  # dS^T Q
        return dk, dv

    zeros = plgpu.layout_cast(jnp.zeros((BLOCK, head_dim), jnp.float32), wgmma)
    dk, dv = jax.lax.fori_loop(j, k_ref.shape[1] // BLOCK, step, (zeros, zeros))
    for value, smem, out in ((dk * scale, k_smem, dk_ref), (dv, v_smem, dv_ref)):
        smem[...] = value.astype(smem.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, out.at[keys])
        plgpu.wait_smem_to_gmem(0)


def backward(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    o: jax.Array,
    lse: jax.Array,
    do: jax.Array,
    *,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(dq, dk, dv)`` of causal attention from the forward's ``o`` and ``lse`` and ``do``."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas import mosaic_gpu as plgpu

    batch, seq, heads, head_dim = _check(q, k, v)
    scale = 1 / math.sqrt(head_dim)
    # delta_r = sum_d o_rd do_rd: XLA fuses it; (batch, heads, seq) like lse
    delta = jnp.einsum("bqhd,bqhd->bhq", o.astype(jnp.float32), do.astype(jnp.float32))
    tile, vec = swizzled_smem((BLOCK, head_dim), q.dtype), plgpu.SMEM((BLOCK,), jnp.float32)
    square = swizzled_smem((BLOCK, BLOCK), q.dtype)
    mode = interpret_params(interpret)
    dq = plgpu.kernel(
        functools.partial(_dq_kernel, scale=scale),
        out_type=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_types=[tile, tile, tile, tile, square, vec, vec, plgpu.Barrier(num_arrivals=1)],
        grid=(batch, heads, seq // BLOCK),
        grid_names=("batch", "heads", "q_block"),
        interpret=mode,
    )(q, k, v, do, lse, delta)
    dk, dv = plgpu.kernel(
        functools.partial(_dkv_kernel, scale=scale),
        out_type=(jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)),
        scratch_types=[tile] * 4 + [square, square, vec, vec, plgpu.Barrier(num_arrivals=1)],
        grid=(batch, heads, seq // BLOCK),
        grid_names=("batch", "heads", "k_block"),
        interpret=mode,
    )(q, k, v, do, lse, delta)
    return dq, dk, dv


def flash_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, *, interpret: bool = False
) -> jax.Array:
    """Causal attention with the flash kernels, differentiable (``jax.custom_vjp``)."""
    import jax

    @jax.custom_vjp
    def attend(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return forward(q, k, v, interpret=interpret)[0]

    def fwd(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        o, lse, _ = forward(q, k, v, interpret=interpret)
        return o, (q, k, v, o, lse)

    def bwd(res: tuple[jax.Array, ...], do: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        q, k, v, o, lse = res
        return backward(q, k, v, o, lse, do, interpret=interpret)

    attend.defvjp(fwd, bwd)
    return attend(q, k, v)


def reference(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal attention in plain JAX, in float32: what the kernels must match."""
    import jax
    import jax.numpy as jnp

    q32, k32, v32 = (a.astype(jnp.float32) for a in (q, k, v))
    seq, head_dim = q.shape[1], q.shape[3]
    s = jnp.einsum("bqhd,bkhd->bhqk", q32, k32) / math.sqrt(head_dim)  # (b, h, seq, seq)
    s = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), s, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v32)


def gradient_errors(
    q: jax.Array, k: jax.Array, v: jax.Array, *, interpret: bool = True
) -> dict[str, float]:
    """Normwise relative error of the kernels' dq, dk, dv against ``jax.grad`` of :func:`reference`.

    The loss weights the output's last axis with a ramp from -1 to 1, so that no gradient is
    uniform and a transposed or misplaced block would show.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    weights = jnp.linspace(-1.0, 1.0, q.shape[-1])  # (head_dim,)

    def loss(attend: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
        return lambda *qkv: (attend(*qkv).astype(jnp.float32) * weights).sum()

    kit = functools.partial(flash_attention, interpret=interpret)
    got = jax.grad(loss(kit), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(reference), argnums=(0, 1, 2))(q, k, v)
    errors = {}
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        errors[name] = float(np.linalg.norm(g64 - w64) / np.linalg.norm(w64))
    return errors
