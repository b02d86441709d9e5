"""labkit.lessons.n02c_export_tensorflow: TF -> StableHLO -> JAX, the quantizer, each checker.

A tiny MLP (16 -> 32 -> 16, batch 4) keeps TensorFlow's part to a few seconds; the quantizer
runs once per module, on two calibration batches.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")  # before anything imports tensorflow or keras

from labkit.export import main_signature, max_rel_error
from labkit.lessons import n02c_export_tensorflow as lesson

# TensorFlow's quantizer calls absl's deprecated logging.warn: its warning, not ours.
pytestmark = pytest.mark.filterwarnings("ignore:The 'warn' function is deprecated")


@pytest.fixture(scope="module")
def tf() -> Any:
    """TensorFlow, imported only by the tests that need it (about 5 s)."""
    return pytest.importorskip("tensorflow")


ADD_ONE = """module @m {
  func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<i32>) -> (tensor<2x3xf32>) {
    %0 = stablehlo.constant dense<1.000000e+00> : tensor<2x3xf32>
    %1 = stablehlo.add %arg0, %0 : tensor<2x3xf32>
    return %1 : tensor<2x3xf32>
  }
}
"""
QUANTIZED = """module {
  func.func @main(%arg0: tensor<i32>, %arg1: tensor<4x16xf32>) -> tensor<4x16xf32> {
    %0 = stablehlo.convert %x : (tensor<4x16xf32>) -> tensor<4x16xi8>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<4x16xi8>, tensor<16x16xi8>) -> tensor<4x16xi32>
    %2 = stablehlo.convert %1 : (tensor<4x16xi32>) -> tensor<4x16xf32>
    %3 = stablehlo.dot_general %2, %v, contracting_dims = [1] x [0] : (tensor<4x16xf32>, tensor<16x16xf32>) -> tensor<4x16xf32>
    %4 = stablehlo.convert %3 : (tensor<4x16xf32>) -> tensor<4x16xi8>
    return %4 : tensor<4x16xi8>
  }
}
"""  # noqa: E501
WEIGHTS = lesson.mlp_weights(0, d_model=16, d_ff=32)
X = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)


def test_weights_are_seeded_float32() -> None:
    again = lesson.mlp_weights(0, d_model=16, d_ff=32)
    assert {k: v.shape for k, v in WEIGHTS.items()} == {
        "w1": (16, 32),
        "b1": (32,),
        "w2": (32, 16),
        "b2": (16,),
    }
    assert all(v.dtype == np.float32 and np.array_equal(v, again[k]) for k, v in WEIGHTS.items())


def test_signature_and_types() -> None:
    assert main_signature(ADD_ONE) == (
        ["tensor<2x3xf32>", "tensor<i32>"],
        ["tensor<2x3xf32>"],
    )
    assert main_signature(QUANTIZED)[0] == ["tensor<i32>", "tensor<4x16xf32>"]
    assert lesson.tensor_type(np.int32(0)) == "tensor<i32>"
    assert lesson.tensor_type(np.zeros((2, 3), np.int8)) == "tensor<2x3xi8>"
    with pytest.raises(ValueError, match=r"func\.func @main"):
        main_signature("HloModule m")


def test_compile_stablehlo_runs_and_checks_inputs() -> None:
    run = lesson.compile_stablehlo(ADD_ONE)
    (out,) = run(np.ones((2, 3), np.float32), np.int32(7))
    assert np.array_equal(out, np.full((2, 3), 2, np.float32))
    with pytest.raises(ValueError, match=r"@main takes .*tensor<3x2xf32>"):
        run(np.ones((3, 2), np.float32), np.int32(7))


def test_int8_helpers_read_the_text() -> None:
    assert len(lesson.int8_dots(QUANTIZED)) == 1  # the f32 dot is not counted
    assert lesson.to_int8_converts(QUANTIZED) == 2
    assert [line[:3] for line in lesson.quantize_section(QUANTIZED, 1, 2)] == ["%1 ", "%2 "]
    assert lesson.tf_dialect_ops('wraps "tf.MatMul"(%a) wraps "tf.Mul"() "tf.MatMul"') == [
        "tf.MatMul",
        "tf.Mul",
    ]


def test_quiet_tf_keeps_native_output_and_shows_it_on_failure(capfd: Any) -> None:
    tf_logger = logging.getLogger("tensorflow")
    before = tf_logger.level
    with lesson.quiet_tf() as out:
        os.write(1, b"native stdout\n")
        assert logging.getLogger("absl").level == logging.ERROR
    assert "native stdout" in out.text and "native stdout" not in capfd.readouterr().out
    assert tf_logger.level == before
    with pytest.raises(RuntimeError, match="boom"), lesson.quiet_tf():
        os.write(2, b"native words\n")
        raise RuntimeError("boom")
    assert "native words" in capfd.readouterr().err


def test_drop_locations_and_expect_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    line = 'error: loc(callsite(fused["AddV2:", "add(1)"] at fused["x"])): \'op\' unsupported'
    assert lesson.drop_locations(line) == "error: 'op' unsupported"
    assert lesson.drop_locations("no location") == "no location"
    with lesson.expect_error_line(ValueError, match="see current") as caught:
        raise ValueError(f"{line}\nnote: loc(x): see current operation")
    assert capsys.readouterr().out == "ValueError: error: 'op' unsupported\n"
    assert "see current operation" in caught.message  # the whole message is kept


def test_quiet_call_tf_drops_only_the_capture_warning(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("jax.experimental.jax2tf.call_tf")
    with caplog.at_level(logging.WARNING, logger=logger.name), lesson.quiet_call_tf():
        logger.warning("call_tf works best with a TensorFlow function that does not capture %s", 1)
        logger.warning("another warning")
    assert [r.getMessage() for r in caplog.records] == ["another warning"]
    assert not logger.filters  # removed after the block


def test_tf_stablehlo_runs_in_jax(tf: Any) -> None:
    model = lesson.tf_mlp(WEIGHTS, batch=4)
    text = model.serve.experimental_get_compiler_ir(tf.constant(X))(stage="stablehlo")
    values = lesson.captured_values(model.serve, X)
    assert [v.shape for v in values] == [(16, 32), (32,), (32, 16), (16,)]
    (y,) = lesson.compile_stablehlo(text)(X, *values)
    assert max_rel_error(y, model.serve(X).numpy()) < 1e-6
    dynamic = lesson.tf_mlp(WEIGHTS, batch=None)
    assert [dynamic.serve(X[:n]).shape[0] for n in (2, 3)] == [2, 3]
    assert dynamic.serve.experimental_get_tracing_count() == 1  # one graph, (None, 16)
    with pytest.raises(ValueError, match="Only support static input shape"):
        dynamic.serve.experimental_get_compiler_ir(tf.TensorSpec([None, 16], tf.float32))
    three = dynamic.serve.experimental_get_compiler_ir(tf.constant(X[:3]))(stage="stablehlo")
    assert lesson.check_static_batch_ir(three, batch=3, d_model=16).passed


def test_keras_mlp_on_jax_or_a_clear_error(tf: Any) -> None:
    import keras

    if keras.backend.backend() != "jax":
        with pytest.raises(RuntimeError, match="KERAS_BACKEND"):
            lesson.keras_mlp(WEIGHTS)
        return
    model = lesson.keras_mlp(WEIGHTS)
    tf_model = lesson.tf_mlp(WEIGHTS, batch=None)  # keep it: serve holds `self` weakly
    reference = tf_model.serve(X).numpy()
    assert max_rel_error(np.asarray(model(X)), reference) < 1e-5


@pytest.fixture(scope="module")
def quantized(tf: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny MLP saved, quantized to int8 StableHLO, loaded back."""
    root = tmp_path_factory.mktemp("n02c")
    model = lesson.tf_mlp(WEIGHTS, batch=4)
    tf.saved_model.save(model, str(root / "float"))
    rng = np.random.default_rng(2)
    data = [{"x": rng.standard_normal((4, 16)).astype(np.float32)} for _ in range(2)]
    q = tf.quantization.experimental
    options = q.QuantizationOptions(
        quantization_method=q.QuantizationMethod(preset_method="METHOD_STATIC_RANGE_INT8"),
        op_set="STABLEHLO",
        tags={"serve"},
        signature_keys=["serving_default"],
    )
    with lesson.quiet_tf() as log, lesson.tf_temporary_files() as scratch:
        q.quantize_saved_model(
            str(root / "float"),
            str(root / "int8"),
            quantization_options=options,
            representative_dataset=data,
        )
        left = sorted(p.name for p in scratch.iterdir())
    loaded = tf.saved_model.load(str(root / "int8"))
    out = loaded.signatures["serving_default"](x=tf.constant(X))["output_0"].numpy()
    return {
        "dir": Path(root / "int8"),
        "log": log.text,
        "y_int8": out,
        "y": model.serve(X).numpy(),
        "tf_files": left,
        "scratch": scratch,
    }


def test_the_quantizer_leaves_no_temporary_file(quantized: dict[str, Any]) -> None:
    # what TensorFlow wrote and never removed: a SavedModel copy, a dump, the dataset
    assert any(n.endswith(".tfrecord") for n in quantized["tf_files"]), quantized["tf_files"]
    assert any(n.startswith("tempfile-") for n in quantized["tf_files"])
    assert not quantized["scratch"].exists()  # gone with the block
    assert os.environ.get("TMPDIR") != str(quantized["scratch"])


def test_quantizer_output_is_int8_stablehlo(quantized: dict[str, Any]) -> None:
    report = lesson.quantization_report(quantized["log"])
    assert len(report) == 2 and {r["method"] for r in report} == {"static_range_ptq"}
    (call,) = lesson.xla_call_modules(quantized["dir"])
    assert call.version >= 9 and "CPU" in call.platforms
    text = call.text
    assert len(lesson.int8_dots(text)) == 2 and lesson.to_int8_converts(text) == 4
    run = lesson.compile_stablehlo(call.module)
    (y,) = run(np.int32(call.platforms.index("CPU")), X)
    assert max_rel_error(y, quantized["y_int8"]) < 1e-6
    assert max_rel_error(quantized["y_int8"], quantized["y"]) < 0.2  # int8, 2 batches
    assert lesson.check_quantize_points(4, text).passed
    assert lesson.check_platform_index(call.platforms.index("CPU"), call.platforms).passed


def test_static_batch_checker() -> None:
    assert lesson.check_static_batch_ir(ADD_ONE.replace("2x3", "3x128"), batch=3).passed
    eight = lesson.check_static_batch_ir(ADD_ONE.replace("2x3", "8x128"), batch=3)
    assert not eight.passed and eight.attempted and "tf.constant" in eight.message
    assert "a str" in lesson.check_static_batch_ir(3, batch=3).message
    assert "func.func @main" in lesson.check_static_batch_ir("not mlir", batch=3).message
    assert not lesson.check_static_batch_ir(..., batch=3).attempted


def test_quantize_points_checker() -> None:
    assert lesson.check_quantize_points(2, QUANTIZED).passed
    wrong = lesson.check_quantize_points(1, QUANTIZED)
    assert not wrong.passed and wrong.attempted and "xi8>" in wrong.message
    assert not lesson.check_quantize_points("four", QUANTIZED).passed
    assert not lesson.check_quantize_points(None, QUANTIZED).attempted


def test_platform_index_checker() -> None:
    assert lesson.check_platform_index(0, ("CPU", "TPU")).passed
    assert lesson.check_platform_index(1, ["TPU", "CPU"]).passed
    wrong = lesson.check_platform_index(1, ("CPU", "TPU"))
    assert not wrong.passed and wrong.attempted and "counting from 0" in wrong.message
    assert not lesson.check_platform_index(..., ("CPU", "TPU")).attempted


def test_tf_converter_keeps_a_none_batch_that_jax_cannot_compile(
    tf: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("n02c_converter")
    tf.saved_model.save(lesson.tf_mlp(WEIGHTS, batch=None), str(root / "dynamic"))
    static = lesson.tf_converter(root / "dynamic", input_shapes="4,16")
    (y,) = lesson.compile_bytecode(static)(X)
    model = lesson.tf_mlp(WEIGHTS, batch=4)
    assert max_rel_error(y, model.serve(X).numpy()) < 1e-6
    dynamic = lesson.tf_converter(root / "dynamic")
    text = lesson.bytecode_text(dynamic)
    assert "tensor<?x16xf32>" in text and "shape.shape_of" in lesson.dialect_ops(text, "shape")
    assert lesson.dialect_ops("stablehlo.add shape.witness", "stablehlo") == ["stablehlo.add"]
    with pytest.raises(Exception, match="unsupported op") as refused:
        lesson.compile_bytecode(dynamic)
    assert "(tensor<2xi32>) -> tensor<2xindex>" in str(refused.value)
