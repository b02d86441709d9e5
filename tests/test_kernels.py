"""labkit.kernels.pallas: Mosaic GPU kernels interpreted, compiled for an H100; the Triton one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from labkit.kernels import pallas
from labkit.xla import hlo


def _xy() -> tuple[jax.Array, jax.Array]:
    x = jax.random.normal(jax.random.key(1), (128, 128), jnp.float32).astype(jnp.bfloat16)
    y = jax.random.normal(jax.random.key(2), (128, 128), jnp.float32).astype(jnp.bfloat16)
    return x, y


def test_matmul_in_interpret_mode_is_within_the_summation_bound() -> None:
    x, y = _xy()
    got = np.asarray(pallas.matmul(x, y, interpret=True), np.float64)
    x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
    bound = 128 * np.finfo(np.float32).eps * (np.abs(x64) @ np.abs(y64))
    assert got.shape == (128, 128) and (np.abs(got - x64 @ y64) <= bound).all()


def test_matmul_rejects_tiles_that_do_not_divide() -> None:
    x = jnp.zeros((192, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match="M=192 is not a multiple"):
        pallas.matmul(x, jnp.zeros((64, 64), jnp.bfloat16), 128, 64, 64, interpret=True)
    with pytest.raises(ValueError, match="multiple of 64"):
        pallas.matmul(x, jnp.zeros((64, 64), jnp.bfloat16), 32, 64, 64, interpret=True)


def test_softmax_within_a_few_ulp() -> None:
    s = 3 * jax.random.normal(jax.random.key(2), (64, 128), jnp.float32)
    got = pallas.softmax(s, interpret=True)
    assert pallas.ulps(got, pallas.softmax_reference(s)) <= 8
    with pytest.raises(ValueError, match="multiple of block_rows"):
        pallas.softmax(s[:32], interpret=True)


def test_mosaic_kernels_compile_for_an_h100() -> None:
    x, y = _xy()
    assert hlo.kernel_counts(pallas.compile_kernel_for_h100(pallas.matmul, x, y).hlo) == {
        "mosaic_gpu_v2": 1
    }
    softmax = pallas.compile_kernel_for_gpu(pallas.softmax, x, target="H100 SXM")
    assert hlo.kernel_counts(softmax.hlo) == {"mosaic_gpu_v2": 1}
    # No B200 compile here: Mosaic GPU keeps the first GPU architecture it compiled for in a
    # process (an H100 kernel compiled after a B200 one is assembled for sm_100a, and fails).


def test_too_much_shared_memory_is_refused_at_compile_time() -> None:
    big = jnp.zeros((512, 512), jnp.bfloat16)
    with pytest.raises(ValueError, match="exceeds available shared memory") as err:
        pallas.compile_kernel_for_h100(lambda a, b: pallas.matmul(a, b, 256, 256, 128), big, big)
    asked, available = pallas.requested_smem(str(err.value)) or (0, 0)
    assert available == pallas.H100_SMEM_OPTIN
    assert asked >= pallas.matmul_smem_bytes(256, 256, 128) > available


def test_smem_bytes_and_the_error_parser() -> None:
    assert pallas.matmul_smem_bytes(128, 128, 64) == 2 * 2 * 128 * 64 * 2 + 128 * 128 * 4
    msg = "Mosaic GPU kernel exceeds available shared memory: smem_bytes=524304 > max_smem_bytes="
    msg += "232448"
    assert pallas.requested_smem(msg) == (524304, 232448) and pallas.requested_smem("x") is None


def test_triton_matmul_warns_that_its_backend_is_deprecated() -> None:
    x, y = _xy()
    result, caught = pallas.warnings_of(pallas.compile_kernel_for_h100, pallas.triton_matmul, x, y)
    assert hlo.kernel_counts(result.hlo) == {"__gpu$xla.gpu.triton": 1}
    assert any("DeprecationWarning" in w and "Mosaic GPU" in w for w in caught)
    x32, y32 = x.astype(jnp.float32), y.astype(jnp.float32)
    got = pallas.triton_matmul(x32, y32, interpret=True)
    assert bool((got == pallas.blocked_reference(x32, y32, block_k=32)).all())


def test_ulps() -> None:
    one = jnp.ones(3, jnp.float32)
    assert pallas.ulps(one, one) == 0
    assert pallas.ulps(one + jnp.finfo(jnp.float32).eps, one) == 1


def test_matmul_t_takes_any_fp8_pair_e5m2_x_e5m2_included() -> None:
    x = jax.random.normal(jax.random.key(0), (128, 128)).astype(jnp.float8_e5m2)
    got = np.asarray(pallas.matmul_t(x, x, interpret=True), np.float64)
    x64 = np.asarray(x, np.float64)
    assert (
        np.abs(got - x64 @ x64.T).max()
        <= 128 * np.finfo(np.float32).eps * np.abs(x64 @ x64.T).max() * 4
    )
    with pytest.raises(ValueError, match=r"\(N, K\)"):
        pallas.matmul_t(x, x[:, :64], interpret=True)
