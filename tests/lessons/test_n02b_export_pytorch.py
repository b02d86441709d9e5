"""labkit.lessons.n02b_export_pytorch: helpers and checkers (no torch), round trips (torch)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from labkit.export import main_signature
from labkit.gpt.config import GPTConfig
from labkit.lessons import n02b_export_pytorch as lesson
from labkit.xla.hlo import op_histogram

CFG = GPTConfig.preset("small")


def _text(fn: object, *args: object) -> str:
    return str(jax.jit(fn).lower(*args).as_text())  # type: ignore[arg-type]


def _bounded_export(constraint: str | None) -> object:
    """A jax.export with weights then a ``(b, 4)`` input, like torchax's (weights, [x])."""
    constraints = (constraint,) if constraint else ()
    (b,) = jax.export.symbolic_shape("b", constraints=constraints)
    x = jax.ShapeDtypeStruct((b, 4), jnp.float32)
    w = jax.ShapeDtypeStruct((4, 4), jnp.float32)
    return jax.export.export(jax.jit(lambda w, x: x @ w))(w, x)


# ---------------------------------------------------------------------------------------
# JAX side and text helpers (no torch)


def test_kit_block_stablehlo_has_eight_matmuls() -> None:
    block = lesson.kit_block(CFG)
    x = np.zeros((2, 16, CFG.d_model), np.float32)  # (batch, seq, d_model)
    ops = op_histogram(lesson.jax_stablehlo(block, x))
    assert ops["stablehlo.dot_general"] == 8 and ops["chlo.square"] > 0
    assert lesson.jax_forward(block, x).shape == x.shape


def test_main_signature_splits_arguments_and_results() -> None:
    text = _text(lambda a, b: (a @ b).sum(0), jnp.zeros((2, 3)), jnp.zeros((3, 4)))
    args, results = main_signature(text)  # shared by the export lessons (labkit.export)
    assert args == ["tensor<2x3xf32>", "tensor<3x4xf32>"] and results == ["tensor<4xf32>"]


def test_function_text_drops_debug_locations() -> None:
    lowered = jax.jit(lambda a: jnp.tanh(a) @ a).lower(jnp.zeros((4, 4)))
    text = lowered.as_text(debug_info=True)
    assert "loc(" in text
    main = lesson.function_text(text, width=60)
    assert main.startswith("func.func public @main") and main.endswith("}")
    assert "loc(" not in main and "stablehlo.dot_general" in main
    assert max(len(line) for line in main.splitlines()) <= 60


def test_compare_ops_puts_both_frameworks_side_by_side() -> None:
    a = _text(lambda x: jnp.tanh(x).T, jnp.zeros((2, 3)))
    b = _text(lambda x: jnp.tanh(x) + 1, jnp.zeros((2, 3)))
    rows = {r["op"]: (r["PyTorch"], r["JAX"]) for r in lesson.compare_ops(a, b, top=50)}
    assert rows["stablehlo.transpose"] == (1, 0) and rows["stablehlo.add"] == (0, 1)
    assert rows["stablehlo.tanh"] == (1, 1)


def test_compiled_hlo_helpers_on_a_cpu_program() -> None:
    hlo = jax.jit(lambda a: jnp.tanh(a).T @ a).lower(jnp.zeros((8, 8))).compile().as_text()
    kernels = lesson.h100_kernels(hlo)
    assert all(r["kernel"].startswith(("fusion ", "custom-call ")) for r in kernels)
    assert lesson.gemm_widths(hlo) == []  # CPU: no Triton GEMM fusions
    assert all(s.startswith("f32[") for s in lesson.transposes(hlo))


# ---------------------------------------------------------------------------------------
# Checkers (no torch)


def test_check_torch_only_ops() -> None:
    torch_text = _text(lambda x: jnp.tanh(x).T, jnp.zeros((2, 3)))
    jax_text = _text(lambda x: jnp.tanh(x) + 1, jnp.zeros((2, 3)))
    assert lesson.check_torch_only_ops({"stablehlo.transpose"}, torch_text, jax_text).passed
    assert lesson.check_torch_only_ops(["stablehlo.transpose"], torch_text, jax_text).passed
    wrong = lesson.check_torch_only_ops({"stablehlo.add"}, torch_text, jax_text)
    assert not wrong.passed and wrong.attempted and "missing" in wrong.message
    odd = lesson.check_torch_only_ops(5, torch_text, jax_text)
    assert not odd.passed and odd.attempted
    todo = lesson.check_torch_only_ops(..., torch_text, jax_text)
    assert not todo.passed and not todo.attempted


def test_check_batch_bound() -> None:
    assert lesson.check_batch_bound(_bounded_export("b <= 64")).passed
    assert not lesson.check_batch_bound(_bounded_export("b <= 32")).passed
    free = lesson.check_batch_bound(_bounded_export(None))
    assert not free.passed and free.attempted and "max=64" in free.message
    static = jax.export.export(jax.jit(lambda x: x * 2))(jnp.zeros((4, 4)))
    assert "constant" in lesson.check_batch_bound(static).message
    text = lesson.check_batch_bound("an export")
    assert text.attempted and not text.passed
    assert not lesson.check_batch_bound(None).attempted


def test_check_kernel_count_compiles_the_cublas_variant() -> None:
    """A torchax-like export (weights, then [x]) for CPU and CUDA, compiled by the checker."""
    from labkit.core.mesh import abstract
    from labkit.xla import aot
    from labkit.xla.hlo import kernel_counts

    def forward(weights: list[jax.Array], xs: tuple[list[jax.Array]]) -> list[jax.Array]:
        (x,) = xs[0]
        return [jax.nn.gelu(x @ weights[0]) @ weights[1] + x]

    w = [np.ones((16, 32), np.float32), np.ones((32, 16), np.float32)]
    exported = jax.export.export(jax.jit(forward), platforms=("cpu", "cuda"))(
        w, ([jax.ShapeDtypeStruct((8, 16), jnp.float32)],)
    )
    mesh = aot.h100_mesh((2,), ("data",))
    x = abstract(jax.ShapeDtypeStruct((8, 16), jnp.float32), mesh, jax.P("data"))
    counts = kernel_counts(lesson.cublas_program(exported, w, x))
    assert counts["__cublas$lt$matmul"] >= 1  # a cuBLAS GEMM, not a Triton fusion
    kernels = sum(counts.values())
    right = lesson.check_kernel_count(kernels, exported, w, x)
    assert right.passed and "cuBLAS GEMMs" in right.message
    wrong = lesson.check_kernel_count(kernels + 1, exported, w, x)
    assert not wrong.passed and "CUBLAS" in wrong.message
    assert not lesson.check_kernel_count("many", exported, w, x).passed
    assert not lesson.check_kernel_count(..., exported, w, x).attempted


def test_expect_error_line_prints_the_first_line_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with lesson.expect_error_line(ValueError, match="node dump") as caught:
        raise ValueError("what went wrong\n\nWhile executing %node: a node dump\nUse tlparse")
    assert capsys.readouterr().out == "ValueError: what went wrong\n"
    assert "tlparse" in caught.message  # the whole message is kept
    with pytest.raises(AssertionError, match="expected a ValueError"):  # still checks the match
        with lesson.expect_error_line(ValueError, match="elsewhere"):
            raise ValueError("what went wrong")


# ---------------------------------------------------------------------------------------
# PyTorch -> StableHLO -> JAX (in .venv-torch: make test runs `-m torch` there)


@pytest.fixture(scope="module")
def twins() -> tuple[object, object, np.ndarray]:
    pytest.importorskip("torch")
    block = lesson.kit_block(CFG, seed=1)
    x = np.random.default_rng(0).standard_normal((4, 32, CFG.d_model), np.float32)
    return block, lesson.torch_block_from(block, CFG), x


@pytest.mark.torch
def test_an_export_leaves_no_folder_in_tmp(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # the child runs this Python: PyTorch's environment
    code = (
        "import os, numpy as np, torch\n"
        "from labkit.lessons import n02b_export_pytorch as lesson\n"
        "lesson.torch_export(torch.nn.Linear(4, 4), np.ones((2, 4), np.float32))\n"
        "print(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n"
    )
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "JAX_PLATFORMS": "cpu"}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert tmp in Path(out.stdout.split()[-1]).parents  # torch's cache folder was made here
    assert list(tmp.iterdir()) == []  # and went with the process (torchinductor_<user> stays)


@pytest.mark.torch
def test_torch_twin_computes_the_kit_block(twins: tuple[object, object, np.ndarray]) -> None:
    block, torch_block, x = twins
    jax_out = lesson.jax_forward(block, x)  # type: ignore[arg-type]
    assert np.abs(lesson.torch_forward(torch_block, x) - jax_out).max() < 1e-5


@pytest.mark.torch
def test_static_round_trip_within_bound(twins: tuple[object, object, np.ndarray]) -> None:
    _, torch_block, x = twins
    program = lesson.torch_export(torch_block, x)
    assert lesson.aten_ops(program)["aten.linear.default"] == 6
    weights, exported = lesson.to_stablehlo(program)
    assert exported.platforms == ("cpu",)
    assert op_histogram(exported.mlir_module())["stablehlo.dot_general"] == 8
    reference = lesson.torch_forward(torch_block, x)
    assert np.abs(lesson.call(exported, weights, x) - reference).max() < 1e-5


@pytest.mark.torch
def test_dynamic_batch_for_two_platforms(twins: tuple[object, object, np.ndarray]) -> None:
    torch = pytest.importorskip("torch")
    _, torch_block, x = twins
    program = lesson.torch_export(torch_block, x, batch=torch.export.Dim("batch", max=16))
    weights, exported = lesson.export_for(program, ("cpu", "cuda"))
    assert (
        exported.platforms == ("cpu", "cuda")
        and lesson.check_batch_bound(exported, max_batch=16).passed
    )
    for b in (1, 3):
        xb = x[:b]
        err = np.abs(lesson.call(exported, weights, xb) - lesson.torch_forward(torch_block, xb))
        assert err.max() < 1e-5


@pytest.mark.torch
def test_data_dependent_shapes_do_not_lower() -> None:
    pytest.importorskip("torch")
    module = lesson.torch_classes()["KeepPositive"]()
    program = lesson.torch_export(module, np.ones((4, 8), np.float32))  # torch.export accepts it
    with pytest.raises(IndexError, match="boolean indices must be concrete"):
        lesson.to_stablehlo(program)


@pytest.mark.torch
def test_dynamic_batch_refuses_zero(twins: tuple[object, object, np.ndarray]) -> None:
    torch = pytest.importorskip("torch")
    _, torch_block, x = twins
    program = lesson.torch_export(torch_block, x, batch=torch.export.Dim("batch"))
    weights, exported = lesson.export_for(program, ("cpu",))
    assert lesson.torch_forward(torch_block, x[:0]).shape[0] == 0  # PyTorch computes it
    with pytest.raises(ValueError, match="Expected value >= 1"):  # JAX assumes b >= 1
        lesson.call(exported, weights, x[:0])
