"""Pallas kernels for NVIDIA GPUs on the Mosaic GPU backend: run on a CPU, compiled for H100s.

A Mosaic GPU kernel (``plgpu.kernel``) is written per *warpgroup* (4 warps, 128 threads) and
moves its own data: asynchronous copies (TMA) from global memory (GMEM) into shared memory
(SMEM), barriers to wait for them, ``wgmma`` (Hopper's warpgroup matrix multiply) reading
SMEM tiles, and copies back. The ``grid`` runs one program per block, as in CUDA.

- :func:`matmul`: tiles of ``x @ y`` with ``wgmma``, the K loop software-pipelined by
  ``plgpu.emit_pipeline`` (:func:`matmul_t`: ``x @ yt.T``, the layout FP8 operands need);
- :func:`softmax`: a row softmax, one read and one write per block of rows;
- flash attention lives in :mod:`labkit.kernels.flash`;
- :func:`triton_matmul`: the same matmul on the Pallas *Triton* backend (``pl.pallas_call``
  on a GPU), which jax 0.12 deprecates: kept to show that warning once (:func:`warnings_of`).

On a CPU every Mosaic GPU kernel runs in Mosaic GPU's interpret mode (``interpret=True``
here: ``plgpu.InterpretGPUParams()``, which simulates SMEM, the copies and the barriers);
:func:`compile_kernel_for_gpu` compiles it for a compile-only H100 (one ``mosaic_gpu_v2``
custom call). Tile sizes are teaching values, not tuned (a deviceless compile cannot tune).

Everything here imports JAX lazily, like :mod:`labkit.xla.aot`.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from labkit.core.types import CompilerOption, PyTree
from labkit.xla.aot import AotResult, abstract, compile_for_gpu, gpu_mesh

H100_SMEM_OPTIN = 232448  # bytes of shared memory one block may opt in to (227 KB, CC 9.0)

if TYPE_CHECKING:  # JAX is imported lazily
    import jax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu
    from jax.typing import ArrayLike, DTypeLike

# A Mosaic GPU kernel's memory reference: a jax.Ref when the kernel runs, but plgpu's functions
# annotate it with JAX's internal AbstractRef, which no public type matches.
type MosaicRef = Any


def interpret_params(interpret: bool) -> plgpu.InterpretGPUParams | None:
    """Mosaic GPU's interpret mode (``plgpu.InterpretGPUParams()``) if ``interpret``, else None."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return plgpu.InterpretGPUParams() if interpret else None


def swizzled_smem(shape: tuple[int, ...], dtype: DTypeLike) -> pl.MemoryRef:
    """An SMEM tile in the layout TMA and wgmma want: 8-row tiles of 128 bytes, swizzled."""
    import jax.numpy as jnp
    from jax.experimental.pallas import mosaic_gpu as plgpu

    per_row = 128 // jnp.dtype(dtype).itemsize  # elements in 128 bytes
    tiling = plgpu.TilingTransform((8, per_row))  # type: ignore[abstract]
    return plgpu.SMEM(shape, dtype, transforms=(tiling, plgpu.SwizzleTransform(128)))  # type: ignore[abstract]


# ---------------------------------------------------------------------------------------
# Matmul


def _matmul_kernel(
    x_gmem: MosaicRef,
    y_gmem: MosaicRef,
    o_gmem: MosaicRef,
    o_smem: MosaicRef,
    *,
    tile_k: int,
    steps: int,
    y_transposed: bool = False,
) -> None:
    """One (tile_m, tile_n) output tile: wgmma over tile_k-wide slices, accumulated in f32."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    i, j = jax.lax.axis_index("m"), jax.lax.axis_index("n")
    tile_m, tile_n = o_smem.shape
    if y_transposed:  # y is (N, K): slices (tile_n, tile_k), read transposed by wgmma
        y_spec = plgpu.BlockSpec((tile_n, tile_k), lambda k: (j, k), delay_release=1)
    else:
        y_spec = plgpu.BlockSpec((tile_k, tile_n), lambda k: (k, j), delay_release=1)

    def k_loop(acc: MosaicRef) -> jax.Array:
        def body(_: jax.Array, x_smem: MosaicRef, y_smem: MosaicRef) -> None:
            y_tile = y_smem.transpose((1, 0)) if y_transposed else y_smem  # (tile_k, tile_n)
            plgpu.wgmma(acc, x_smem, y_tile)  # acc += x_tile @ y_tile, asynchronously
            plgpu.wgmma_wait(1)  # keep one wgmma in flight while the next tiles load

        plgpu.emit_pipeline(  # copies the next K slices into SMEM while wgmma runs
            body,
            grid=(x_gmem.shape[1] // tile_k,),
            in_specs=[plgpu.BlockSpec((tile_m, tile_k), lambda k: (i, k), delay_release=1), y_spec],
            max_concurrent_steps=steps,
        )(x_gmem, y_gmem)
        return acc[...]

    o_smem[...] = pl.run_scoped(k_loop, plgpu.ACC((tile_m, tile_n), jnp.float32)).astype(
        o_smem.dtype
    )
    plgpu.commit_smem()  # make the SMEM writes visible to the copy engine
    plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[pl.ds(i * tile_m, tile_m), pl.ds(j * tile_n, tile_n)])
    plgpu.wait_smem_to_gmem(0)


def matmul(
    x: jax.Array,
    y: jax.Array,
    tile_m: int = 128,
    tile_n: int = 128,
    tile_k: int = 64,
    *,
    steps: int = 2,
    out_dtype: DTypeLike | None = None,
    interpret: bool = False,
) -> jax.Array:
    """``x @ y`` (bf16 or f16) as a Mosaic GPU kernel: one program per output tile, wgmma.

    ``steps``: K slices in flight in the pipeline (each takes SMEM). ``out_dtype`` defaults
    to float32, the accumulator's type. For 8-bit operands use :func:`matmul_t`.
    """
    (m, k), (k2, n) = x.shape, y.shape
    if k != k2:
        raise ValueError(f"inner sizes differ: x is {x.shape}, y is {y.shape}")
    return _matmul(x, y, (m, n, k), (tile_m, tile_n, tile_k), steps, out_dtype, interpret)


def matmul_t(
    x: jax.Array,
    yt: jax.Array,
    tile_m: int = 128,
    tile_n: int = 128,
    tile_k: int = 128,
    *,
    steps: int = 2,
    interpret: bool = False,
) -> jax.Array:
    """``x @ yt.T`` as a Mosaic GPU kernel, f32 out: the layout 8-bit (FP8) wgmma needs.

    Hopper's wgmma reads 8-bit operands only K-major (both with K contiguous), so ``yt`` is
    (N, K). Any pair of ``float8_e4m3fn`` and ``float8_e5m2`` works, e5m2 x e5m2 included.
    """
    (m, k), (n, k2) = x.shape, yt.shape
    if k != k2:
        raise ValueError(f"inner sizes differ: x is {x.shape}, yt is {yt.shape} (N, K)")
    sizes, tiles = (m, n, k), (tile_m, tile_n, tile_k)
    return _matmul(x, yt, sizes, tiles, steps, None, interpret, y_transposed=True)


def _matmul(
    x: jax.Array,
    y: jax.Array,
    sizes: tuple[int, int, int],
    tiles: tuple[int, int, int],
    steps: int,
    out_dtype: DTypeLike | None,
    interpret: bool,
    y_transposed: bool = False,
) -> jax.Array:
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas import mosaic_gpu as plgpu

    (m, n, k), (tile_m, tile_n, tile_k) = sizes, tiles
    for name, size, tile in (("M", m, tile_m), ("N", n, tile_n), ("K", k, tile_k)):
        if size % tile:
            raise ValueError(f"{name}={size} is not a multiple of its tile {tile}; pick a divisor")
    if tile_m % 64:
        raise ValueError(f"tile_m={tile_m} must be a multiple of 64: the rows of one wgmma")
    out_dtype = jnp.dtype(out_dtype or jnp.float32)
    kernel = plgpu.kernel(
        functools.partial(_matmul_kernel, tile_k=tile_k, steps=steps, y_transposed=y_transposed),
        out_type=jax.ShapeDtypeStruct((m, n), out_dtype),
        scratch_types=[plgpu.SMEM((tile_m, tile_n), out_dtype)],
        grid=(m // tile_m, n // tile_n),
        grid_names=("m", "n"),
        interpret=interpret_params(interpret),
    )
    return kernel(x, y)


def matmul_smem_bytes(
    tile_m: int, tile_n: int, tile_k: int, itemsize: int = 2, steps: int = 2, out_itemsize: int = 4
) -> int:
    """Shared memory :func:`matmul` asks for: ``steps`` x and y slices, plus the output tile."""
    return steps * (tile_m * tile_k + tile_k * tile_n) * itemsize + tile_m * tile_n * out_itemsize


def blocked_reference(x: jax.Array, y: jax.Array, block_k: int = 64) -> jax.Array:
    """``x @ y`` in plain JAX summing f32 products of K slices in order, as the kernel does."""
    import jax.numpy as jnp

    acc = jnp.zeros((x.shape[0], y.shape[1]), jnp.float32)
    for i in range(0, x.shape[1], block_k):
        acc = acc + jnp.dot(
            x[:, i : i + block_k], y[i : i + block_k], preferred_element_type=jnp.float32
        )
    return acc


# ---------------------------------------------------------------------------------------
# Softmax


def _softmax_kernel(
    x_gmem: MosaicRef, o_gmem: MosaicRef, x_smem: MosaicRef, barrier: MosaicRef
) -> None:
    """Softmax over the last axis of a block of rows, in f32: one read, one write."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    rows = x_smem.shape[0]
    block = pl.ds(jax.lax.axis_index("rows") * rows, rows)
    plgpu.copy_gmem_to_smem(x_gmem.at[block], x_smem, barrier)  # an async copy (TMA)
    plgpu.barrier_wait(barrier)
    x = plgpu.load(x_smem, layout=plgpu.Layout.WGMMA).astype(jnp.float32)  # (rows, n)
    e = jnp.exp(x - jax.lax.broadcast_in_dim(x.max(axis=1), x.shape, [0]))
    x_smem[...] = (e / jax.lax.broadcast_in_dim(e.sum(axis=1), x.shape, [0])).astype(x_smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(x_smem, o_gmem.at[block])
    plgpu.wait_smem_to_gmem(0)


def softmax(x: jax.Array, block_rows: int = 64, *, interpret: bool = False) -> jax.Array:
    """Row softmax of a 2-D array, fused into one Mosaic GPU kernel (whole rows per block)."""
    import jax
    from jax.experimental.pallas import mosaic_gpu as plgpu

    rows, _ = x.shape
    if rows % block_rows or block_rows % 64:
        raise ValueError(
            f"{rows} rows must be a multiple of block_rows={block_rows}, itself a multiple of "
            "64 (the rows of the register layout the row reductions use)"
        )
    kernel = plgpu.kernel(
        _softmax_kernel,
        out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_types=[
            swizzled_smem((block_rows, x.shape[1]), x.dtype),
            plgpu.Barrier(num_arrivals=1),
        ],
        grid=(rows // block_rows,),
        grid_names=("rows",),
        interpret=interpret_params(interpret),
    )
    return kernel(x)


def softmax_reference(x: jax.Array) -> jax.Array:
    """The same arithmetic in plain JAX: f32 max-subtracted exponentials over their sum."""
    import jax.numpy as jnp

    x32 = x.astype(jnp.float32)
    e = jnp.exp(x32 - jnp.max(x32, axis=-1, keepdims=True))
    return (e / jnp.sum(e, axis=-1, keepdims=True)).astype(x.dtype)


# ---------------------------------------------------------------------------------------
# The Triton backend (deprecated in jax 0.12), shown once


def _triton_matmul_kernel(x_ref: jax.Ref, y_ref: jax.Ref, o_ref: jax.Ref, *, block_k: int) -> None:
    """One output tile: BlockSpecs bring row and column bands; a loop over K slices in f32."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def step(i: jax.Array, acc: jax.Array) -> jax.Array:
        x = x_ref[:, pl.ds(i * block_k, block_k)]  # (block_m, block_k)
        y = y_ref[pl.ds(i * block_k, block_k), :]  # (block_k, block_n)
        return acc + jnp.dot(x, y, preferred_element_type=jnp.float32)

    acc = jnp.zeros(o_ref.shape, jnp.float32)  # (block_m, block_n)
    o_ref[...] = jax.lax.fori_loop(0, x_ref.shape[1] // block_k, step, acc).astype(o_ref.dtype)


def triton_matmul(
    x: jax.Array,
    y: jax.Array,
    block_m: int = 64,
    block_n: int = 64,
    block_k: int = 32,
    *,
    interpret: bool = False,
) -> jax.Array:
    """``x @ y`` with ``pl.pallas_call``: on a GPU, the Pallas Triton backend (deprecated)."""
    import jax
    from jax.experimental import pallas as pl

    (m, k), (_, n) = x.shape, y.shape
    return pl.pallas_call(
        functools.partial(_triton_matmul_kernel, block_k=block_k),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // block_m, n // block_n),
        in_specs=[
            pl.BlockSpec((block_m, k), lambda i, j: (i, 0)),  # a row band of x
            pl.BlockSpec((k, block_n), lambda i, j: (0, j)),  # a column band of y
        ],
        out_specs=pl.BlockSpec((block_m, block_n), lambda i, j: (i, j)),
        interpret=interpret,
    )(x, y)


def warnings_of[T](fn: Callable[..., T], *args: object, **kwargs: object) -> tuple[T, list[str]]:
    """``fn(*args, **kwargs)`` and every warning it raised, as ``"Category: message"`` lines.

    Python shows a DeprecationWarning raised inside a library only once, or not at all; this
    records them all ("always") so the caller can print them, without filtering any away.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    return result, [f"{w.category.__name__}: {w.message}" for w in caught]


# ---------------------------------------------------------------------------------------
# Compiling for one GPU, and reading errors


def compile_kernel_for_gpu(
    fn: Callable[..., PyTree],
    *arrays: jax.Array | jax.ShapeDtypeStruct,
    target: str = "H100 SXM",
    **options: CompilerOption,
) -> AotResult:
    """Compile ``fn(*arrays)`` for one compile-only ``target`` GPU, Pallas kernels included.

    ``arrays`` give shapes and dtypes (arrays or ShapeDtypeStructs). Pallas lowers only
    when the GPU mesh is the abstract mesh, so it is set around the compile.
    """
    import jax

    mesh = gpu_mesh((1,), ("x",), target=target)
    args = [abstract(a, mesh) for a in arrays]
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        return compile_for_gpu(fn, *args, compiler_options=options or None)


def compile_kernel_for_h100(
    fn: Callable[..., PyTree],
    *arrays: jax.Array | jax.ShapeDtypeStruct,
    **options: CompilerOption,
) -> AotResult:
    """:func:`compile_kernel_for_gpu` for one H100 SXM."""
    return compile_kernel_for_gpu(fn, *arrays, target="H100 SXM", **options)


def requested_smem(message: str) -> tuple[int, int] | None:
    """``(asked, available)`` shared-memory bytes from Mosaic GPU's "exceeds available" error."""
    m = re.search(r"smem_bytes=(\d+) > max_smem_bytes=(\d+)", message)
    return (int(m.group(1)), int(m.group(2))) if m else None


def ulps(a: ArrayLike, b: ArrayLike) -> int:
    """Largest distance between two float arrays in units in the last place of ``b``'s dtype."""
    import jax.numpy as jnp
    import numpy as np

    eps = float(jnp.finfo(jnp.asarray(b).dtype).eps)  # spacing of numbers in [1, 2)
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    tiny = float(jnp.finfo(jnp.asarray(b).dtype).tiny)
    spacing = eps * np.exp2(np.floor(np.log2(np.maximum(np.abs(b64), tiny))))
    return int(np.max(np.round(np.abs(a64 - b64) / spacing)))
