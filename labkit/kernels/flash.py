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
from typing import TYPE_CHECKING, Any, NamedTuple

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


def _rows(b: jax.Array, h: jax.Array, block: jax.Array) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Indexers of one block of ``BLOCK`` rows of (batch ``b``, head ``h``): into q, k, v, o
    (batch, seq, heads, head_dim), and into a per-row vector (batch, heads, seq)."""
    from jax.experimental import pallas as pl

    rows = pl.ds(block * BLOCK, BLOCK)
    return (b, rows, h), (b, h, rows)


def _copy_in(barrier: MosaicRef, *pairs: tuple[MosaicRef, MosaicRef]) -> None:
    """Copy each ``(global-memory slice, shared-memory tile)`` pair in, one after the other
    (the kernels do not pipeline their copies)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    for src, dst in pairs:
        plgpu.copy_gmem_to_smem(src, dst, barrier)
        plgpu.barrier_wait(barrier)


def _copy_out(value: jax.Array, smem: MosaicRef, dst: MosaicRef) -> None:
    """Write ``value`` into the shared-memory tile ``smem`` (in its dtype), then copy it out to
    the global-memory slice ``dst``."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    smem[...] = value.astype(smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, dst)
    plgpu.wait_smem_to_gmem(0)


def _causal(query_axis: int, i: jax.Array, j: jax.Array) -> jax.Array:
    """Where a query may see a key in the (BLOCK, BLOCK) tile of query block ``i`` and key
    block ``j`` (query position >= key position), queries along ``query_axis``."""
    import jax.numpy as jnp
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def positions(axis: int, block: jax.Array) -> jax.Array:
        iota = plgpu.broadcasted_iota(jnp.int32, (BLOCK, BLOCK), axis, layout=plgpu.Layout.WGMMA)
        return iota + block * BLOCK

    return positions(query_axis, i) >= positions(1 - query_axis, j)


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
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b, h, i = (jax.lax.axis_index(n) for n in ("batch", "heads", "q_block"))
    rows, vec = _rows(b, h, i)  # this program's queries
    _copy_in(barrier, (q_ref.at[rows], q_smem))
    wgmma, row = plgpu.Layout.WGMMA, plgpu.Layout.WGMMA.reduce(1)
    head_dim = q_smem.shape[-1]

    def step(j: jax.Array, carry: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        acc, m, total = carry  # (BLOCK, head_dim) f32; (BLOCK,) row max; (BLOCK,) row sum
        keys, _ = _rows(b, h, j)
        _copy_in(barrier, (k_ref.at[keys], k_smem), (v_ref.at[keys], v_smem))

        s = _product(q_smem, k_smem.transpose((1, 0)), (BLOCK, BLOCK)) * scale
        s = jnp.where(_causal(0, i, j), s, -jnp.inf)  # only the diagonal block masks anything
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
    _copy_out(acc / jax.lax.broadcast_in_dim(total, acc.shape, [0]), q_smem, o_ref.at[rows])
    # per query row: log-sum-exp, key blocks visited
    for ref, value in ((lse_ref, m + jnp.log(total)), (visits_ref, (i + 1) + 0.0 * m)):
        _copy_out(value, row_smem, ref.at[vec])


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


class _Inputs(NamedTuple):
    """What both backward kernels read from global memory: q, k, v and do (batch, seq, heads,
    head_dim), and each row's ``lse`` and ``delta`` (batch, heads, seq)."""

    q: MosaicRef
    k: MosaicRef
    v: MosaicRef
    do: MosaicRef
    lse: MosaicRef
    delta: MosaicRef


class _Tiles(NamedTuple):
    """Both backward kernels' shared memory: one block each of q, do, k and v (BLOCK,
    head_dim), a (BLOCK, BLOCK) dS tile, one block of lse and delta (BLOCK,), the barrier."""

    q: MosaicRef
    do: MosaicRef
    k: MosaicRef
    v: MosaicRef
    ds: MosaicRef
    lse: MosaicRef
    delta: MosaicRef
    barrier: MosaicRef


def _load_keys(x: _Inputs, t: _Tiles, b: jax.Array, h: jax.Array, j: jax.Array) -> None:
    """Key block ``j`` of k and v into shared memory."""
    keys, _ = _rows(b, h, j)
    _copy_in(t.barrier, (x.k.at[keys], t.k), (x.v.at[keys], t.v))


def _load_queries(
    x: _Inputs, t: _Tiles, b: jax.Array, h: jax.Array, i: jax.Array, layout: Any
) -> tuple[jax.Array, jax.Array]:
    """Query block ``i`` of q and do into shared memory, and its rows' ``(lse, delta)``, also
    loaded into registers in ``layout``."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    rows, vec = _rows(b, h, i)
    pairs = ((x.q, t.q, rows), (x.do, t.do, rows), (x.lse, t.lse, vec), (x.delta, t.delta, vec))
    _copy_in(t.barrier, *((ref.at[at], tile) for ref, tile, at in pairs))
    return plgpu.load(t.lse, layout=layout), plgpu.load(t.delta, layout=layout)


def _p_and_ds(
    t: _Tiles,
    i: jax.Array,
    j: jax.Array,
    lse: jax.Array,
    delta: jax.Array,
    scale: float,
    transposed: bool,
) -> tuple[jax.Array, jax.Array]:
    """``P = exp(S - lse)`` (causal) and ``dS = P * (dP - delta)`` of query block ``i`` against
    key block ``j``, from the tiles in ``t``: (queries, keys) tiles, or (keys, queries) if
    ``transposed`` (the dk/dv kernel's orientation: its products want P^T and dS^T)."""
    import jax
    import jax.numpy as jnp

    square = (BLOCK, BLOCK)
    if transposed:
        s = _product(t.k, t.q.transpose((1, 0)), square) * scale  # K Q^T = S^T
        dp = _product(t.v, t.do.transpose((1, 0)), square)  # V dO^T = dP^T
    else:
        s = _product(t.q, t.k.transpose((1, 0)), square) * scale  # Q K^T = S
        dp = _product(t.do, t.v.transpose((1, 0)), square)  # dO V^T = dP
    axis = 1 if transposed else 0  # the query axis of the tiles
    p = jnp.where(
        _causal(axis, i, j), jnp.exp(s - jax.lax.broadcast_in_dim(lse, square, [axis])), 0.0
    )
    return p, p * (dp - jax.lax.broadcast_in_dim(delta, square, [axis]))


def _dq_kernel(x: _Inputs, dq_ref: MosaicRef, t: _Tiles, *, scale: float) -> None:
    """dq of one query block: ``sum_j dS_ij k_j`` over key blocks 0 .. the diagonal."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b, h, i = (jax.lax.axis_index(n) for n in ("batch", "heads", "q_block"))
    lse, delta = _load_queries(x, t, b, h, i, plgpu.Layout.WGMMA.reduce(1))
    head_dim = t.q.shape[-1]

    def step(j: jax.Array, dq: jax.Array) -> jax.Array:
        _load_keys(x, t, b, h, j)
        _, ds = _p_and_ds(t, i, j, lse, delta, scale, transposed=False)
        t.ds[...] = ds.astype(t.ds.dtype)
        plgpu.commit_smem()
        return dq + _product(t.ds, t.k, (BLOCK, head_dim))  # dS K

    dq = plgpu.layout_cast(jnp.zeros((BLOCK, head_dim), jnp.float32), plgpu.Layout.WGMMA)
    dq = jax.lax.fori_loop(0, i + 1, step, dq)
    _copy_out(dq * scale, t.q, dq_ref.at[_rows(b, h, i)[0]])


def _dkv_kernel(
    x: _Inputs, dk_ref: MosaicRef, dv_ref: MosaicRef, t: _Tiles, pt_smem: MosaicRef, *, scale: float
) -> None:
    """dk, dv of one key block, over query blocks from the diagonal to the end (transposed)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b, h, j = (jax.lax.axis_index(n) for n in ("batch", "heads", "k_block"))
    _load_keys(x, t, b, h, j)
    head_dim = t.k.shape[-1]

    def step(i: jax.Array, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        dk, dv = carry
        lse, delta = _load_queries(x, t, b, h, i, plgpu.Layout.WGMMA.reduce(0))
        pt, dst = _p_and_ds(t, i, j, lse, delta, scale, transposed=True)
        pt_smem[...] = pt.astype(pt_smem.dtype)
        t.ds[...] = dst.astype(t.ds.dtype)
        plgpu.commit_smem()
        dv = dv + _product(pt_smem, t.do, (BLOCK, head_dim))  # P^T dO
        dk = dk + _product(t.ds, t.q, (BLOCK, head_dim))  # dS^T Q
        return dk, dv

    zeros = plgpu.layout_cast(jnp.zeros((BLOCK, head_dim), jnp.float32), plgpu.Layout.WGMMA)
    dk, dv = jax.lax.fori_loop(j, x.k.shape[1] // BLOCK, step, (zeros, zeros))
    keys, _ = _rows(b, h, j)
    _copy_out(dk * scale, t.k, dk_ref.at[keys])
    _copy_out(dv, t.v, dv_ref.at[keys])


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
    barrier = plgpu.Barrier(num_arrivals=1)
    tiles = _Tiles(tile, tile, tile, tile, square, vec, vec, barrier)
    inputs = _Inputs(q, k, v, do, lse, delta)
    dq = plgpu.kernel(
        functools.partial(_dq_kernel, scale=scale),
        out_type=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_types=[tiles],
        grid=(batch, heads, seq // BLOCK),
        grid_names=("batch", "heads", "q_block"),
        interpret=interpret_params(interpret),
    )(inputs)
    dk, dv = plgpu.kernel(
        functools.partial(_dkv_kernel, scale=scale),
        out_type=(jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)),
        scratch_types=[tiles, square],  # and P^T, the left operand of P^T dO
        grid=(batch, heads, seq // BLOCK),
        grid_names=("batch", "heads", "k_block"),
        interpret=interpret_params(interpret),
    )(inputs)
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
