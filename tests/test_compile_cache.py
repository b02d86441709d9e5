"""labkit.xla.compile_cache: a deviceless compile served again, in this process or a fresh one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

from labkit.core.mesh import abstract
from labkit.xla import compile_cache
from labkit.xla.aot import b200_mesh, compile_for_gpu, h100_mesh
from labkit.xla.cost import cost
from labkit.xla.memory import memory


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache folder of this test's own."""
    monkeypatch.setenv("LABKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LABKIT_COMPILE_CACHE", raising=False)
    return tmp_path / "compiles"


def _args(n: int = 128, mesh_of: object = h100_mesh) -> tuple[object, object]:
    mesh = mesh_of((1,), ("x",))  # type: ignore[operator]
    x = abstract(jnp.zeros((n, n), jnp.bfloat16), mesh)
    return x, x


def _matmul(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    return jnp.tanh(a @ b)


def test_a_second_compile_is_served_with_xlas_own_readings(folder: Path) -> None:
    first = compile_for_gpu(_matmul, *_args())
    second = compile_for_gpu(_matmul, *_args())
    assert not first.from_cache and second.from_cache
    assert len(list(folder.glob("*.json.z"))) == 1
    assert second.hlo == first.hlo == second.compiled.as_text()
    assert memory(second.compiled) == memory(first.compiled)
    assert cost(second.compiled) == cost(first.compiled)
    assert second.seconds == first.seconds > 0  # the compile's own time, kept with it


def test_what_changes_the_program_changes_the_key(folder: Path) -> None:
    compile_for_gpu(_matmul, *_args())
    assert not compile_for_gpu(_matmul, *_args(256)).from_cache  # another shape
    assert not compile_for_gpu(jnp.matmul, *_args()).from_cache  # another function
    assert not compile_for_gpu(_matmul, *_args(mesh_of=b200_mesh)).from_cache  # another GPU
    options = {"xla_gpu_enable_triton_gemm": False}
    assert not compile_for_gpu(_matmul, *_args(), compiler_options=options).from_cache
    assert compile_for_gpu(_matmul, *_args(), compiler_options=options).from_cache
    assert len(list(folder.glob("*.json.z"))) == 5


def test_the_kernel_cache_file_is_not_part_of_the_key(folder: Path, tmp_path: Path) -> None:
    compile_for_gpu(_matmul, *_args())
    options = {"xla_gpu_kernel_cache_file": str(tmp_path / "kernels.bin")}
    assert compile_for_gpu(_matmul, *_args(), compiler_options=options).from_cache


def test_a_file_an_option_names_counts_by_its_contents(folder: Path, tmp_path: Path) -> None:
    profile = tmp_path / "profile.pbtxt"
    profile.write_text("")
    options = {"xla_gpu_pgle_profile_file_or_directory_path": str(profile)}
    compile_for_gpu(_matmul, *_args(), compiler_options=options)
    assert compile_for_gpu(_matmul, *_args(), compiler_options=options).from_cache
    before = compiler_key(options)
    profile.write_text('costs { name: "dot" cost_us: 1000.0 }\n')
    assert compiler_key(options) != before
    assert not compile_for_gpu(_matmul, *_args(), compiler_options=options).from_cache


def compiler_key(options: dict[str, object]) -> str:
    """The cache key of :func:`_matmul` with ``options``."""
    import jax

    x, y = _args()
    lowered = jax.jit(_matmul).lower(x, y)
    return compile_cache.key(lowered, options, list(x.sharding.device_set))  # type: ignore[attr-defined]


def test_dumps_timed_compiles_and_off_are_never_served(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not compile_for_gpu(_matmul, *_args(), cache=False).from_cache  # stores nothing
    assert not list(folder.glob("*.json.z"))
    compile_for_gpu(_matmul, *_args())
    assert not compile_for_gpu(_matmul, *_args(), cache=False).from_cache
    dump = {"xla_dump_to": str(tmp_path / "dump")}
    assert not compile_for_gpu(_matmul, *_args(), compiler_options=dump).from_cache
    assert list((tmp_path / "dump").iterdir()), "the dump was written"
    monkeypatch.setenv("LABKIT_COMPILE_CACHE", "off")
    assert not compile_cache.enabled()
    assert not compile_for_gpu(_matmul, *_args()).from_cache


def test_a_damaged_entry_is_a_miss_and_is_replaced(folder: Path) -> None:
    first = compile_for_gpu(_matmul, *_args())
    (entry,) = folder.glob("*.json.z")
    entry.write_bytes(b"not zlib")
    again = compile_for_gpu(_matmul, *_args())
    assert not again.from_cache and again.hlo == first.hlo
    assert compile_for_gpu(_matmul, *_args()).from_cache


def test_a_stored_compile_says_what_it_cannot_do(folder: Path) -> None:
    compile_for_gpu(_matmul, *_args())
    stored = compile_for_gpu(_matmul, *_args()).compiled
    with pytest.raises(AttributeError, match=r"compile cache .* cache=False"):
        stored.runtime_executable()  # type: ignore[union-attr]


CHILD = """
import jax.numpy as jnp
from labkit.core.env import setup
setup(cpu_devices=1, mode="cpu")
from labkit.core.mesh import abstract
from labkit.xla.aot import compile_for_gpu, h100_mesh
x = abstract(jnp.zeros((128, 128), jnp.bfloat16), h100_mesh((1,), ("x",)))
result = compile_for_gpu(lambda a, b: jnp.tanh(a @ b), x, x)
print(result.from_cache, len(result.hlo))
"""


def test_a_fresh_process_is_served_what_another_compiled(folder: Path) -> None:
    def run() -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    first, second = run(), run()
    assert (first[0], second[0]) == ("False", "True")
    assert first[1] == second[1]


def test_a_mosaic_gpu_kernel_is_never_stored(folder: Path) -> None:
    from labkit.kernels import pallas

    x = jnp.zeros((128, 128), jnp.bfloat16)
    first = pallas.compile_kernel_for_h100(pallas.matmul, x, x)
    assert compile_cache.MOSAIC_GPU_CALL in first.hlo
    assert not pallas.compile_kernel_for_h100(pallas.matmul, x, x).from_cache
    assert not list(folder.glob("*.json.z"))


def test_an_executable_jax_served_stale_is_not_stored(folder: Path) -> None:
    import jax

    step = jax.jit(_matmul)  # one jitted function: JAX's in-process cache serves it again
    first = compile_for_gpu(step, *_args())
    old = jax.config.jax_optimization_level
    jax.config.update("jax_optimization_level", "O1")  # in the key here, not in JAX's
    try:
        again = compile_for_gpu(step, *_args())
    finally:
        jax.config.update("jax_optimization_level", old)
    assert not again.from_cache and again.compiled is not first.compiled
    assert len(list(folder.glob("*.json.z"))) == 1, "the stale program was stored under O1"
