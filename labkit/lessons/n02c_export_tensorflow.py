"""02c_export_tensorflow: StableHLO from TensorFlow, run in JAX; the StableHLO Quantizer.

One small MLP (d_model -> d_ff -> GELU -> d_model) is built three ways from the same numpy
weights: a ``tf.Module`` with ``tf.Variable`` weights (no Keras: the TF-native parts), the
same module saved as a SavedModel, and a Keras 3 model on the JAX backend (the dynamic
batch). TensorFlow is imported inside the functions, so importing this module stays cheap.

StableHLO text that TensorFlow made has no public JAX entry point (``jax.export`` only
deserializes artifacts JAX itself serialized, with their calling convention and metadata):
:func:`compile_stablehlo` hands the module to JAX's backend, the PJRT client, through
``jax.extend.backend`` and runs the executable on numpy inputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from labkit.core.feedback import (
    Caught,
    Feedback,
    check_choice,
    check_integer,
    expect_error,
    first_line,
    judge,
    unanswered,
)
from labkit.export import main_signature
from labkit.xla.hlo import op_histogram

if TYPE_CHECKING:  # imported inside the functions: importing this module stays cheap
    import keras
    import tensorflow as tf

D_MODEL = 128
D_FF = 512


def mlp_weights(seed: int = 0, d_model: int = D_MODEL, d_ff: int = D_FF) -> dict[str, np.ndarray]:
    """Float32 weights ``w1 (d_model, d_ff)``, ``b1``, ``w2 (d_ff, d_model)``, ``b2``."""
    rng = np.random.default_rng(seed)
    return {
        "w1": (rng.standard_normal((d_model, d_ff)) / np.sqrt(d_model)).astype(np.float32),
        "b1": (0.1 * rng.standard_normal(d_ff)).astype(np.float32),
        "w2": (rng.standard_normal((d_ff, d_model)) / np.sqrt(d_ff)).astype(np.float32),
        "b2": (0.1 * rng.standard_normal(d_model)).astype(np.float32),
    }


def tf_mlp(weights: dict[str, np.ndarray], batch: int | None) -> tf.Module:
    """A ``tf.Module`` holding the weights as ``tf.Variable``; ``.serve(x)`` is the forward pass.

    ``serve`` is a ``tf.function(jit_compile=True)`` (TensorFlow compiles it with XLA) with an
    ``input_signature`` of ``(batch, d_model)`` float32 named ``x`` (``batch=None``: any batch).
    The signature is what SavedModel and the quantizer need; its first argument is ``self``.
    Keep the returned module in a variable: ``serve`` holds ``self`` only weakly.
    AutoGraph is off (``autograph=False``): the forward pass has no Python control flow to
    convert, and AutoGraph's handling of a method's ``self`` once failed a CI run with
    ``'TfMethodTarget' object has no attribute 'w1'`` (``self`` arrived unbound).
    """
    import tensorflow as tf

    d_model = weights["w1"].shape[0]
    spec = tf.TensorSpec([batch, d_model], tf.float32, name="x")

    class MLP(tf.Module):
        def __init__(self) -> None:
            super().__init__(name="mlp")
            self.w1, self.b1 = tf.Variable(weights["w1"]), tf.Variable(weights["b1"])
            self.w2, self.b2 = tf.Variable(weights["w2"]), tf.Variable(weights["b2"])

        @tf.function(jit_compile=True, input_signature=[spec], autograph=False)
        def serve(self, x: tf.Tensor) -> tf.Tensor:
            h = tf.nn.gelu(x @ self.w1 + self.b1)  # (batch, d_ff), exact (erf) GELU
            return h @ self.w2 + self.b2  # (batch, d_model)

    return MLP()


def keras_mlp(weights: dict[str, np.ndarray]) -> keras.Sequential:
    """The same MLP as a Keras 3 ``Sequential`` (Dense + exact GELU, Dense), weights copied in.

    Raises RuntimeError if Keras did not start on the JAX backend (it picks one per process,
    when ``keras`` is first imported; ``import tensorflow`` imports it too).
    """
    import keras

    if keras.backend.backend() != "jax":
        raise RuntimeError(
            f"Keras runs on the {keras.backend.backend()!r} backend in this process: set "
            "os.environ['KERAS_BACKEND'] = 'jax' before importing tensorflow or keras, then "
            "restart the kernel (the backend is fixed at the first import)"
        )
    d_model, d_ff = weights["w1"].shape
    model = keras.Sequential(
        [
            keras.Input((d_model,)),
            keras.layers.Dense(d_ff, activation="gelu"),
            keras.layers.Dense(d_model),
        ]
    )
    model.set_weights([weights[k] for k in ("w1", "b1", "w2", "b2")])
    return model


def captured_values(fn: tf.types.experimental.GenericFunction, *args: object) -> list[np.ndarray]:
    """The values of the variables a ``tf.function`` captures, in the order XLA passes them.

    TensorFlow's StableHLO takes the function's inputs first, then one argument per captured
    variable, in the order of ``concrete_function.captured_inputs``.
    """
    concrete = fn.get_concrete_function(*args)
    by_handle = {id(v.handle): v for v in concrete.variables}
    return [np.asarray(by_handle[id(h)].numpy()) for h in concrete.captured_inputs]


# ---------------------------------------------------------------------------------------
# StableHLO text: signature, portable artifacts, running it in JAX

_DTYPES = {
    "float32": "f32",
    "float64": "f64",
    "int32": "i32",
    "int64": "i64",
    "int8": "i8",
    "bool": "i1",
    "float16": "f16",
    "bfloat16": "bf16",
}


def tensor_type(x: ArrayLike) -> str:
    """The MLIR type of a numpy value: ``tensor<8x128xf32>``, ``tensor<i32>`` for a scalar."""
    a = np.asarray(x)
    dims = "".join(f"{d}x" for d in a.shape)
    return f"tensor<{dims}{_DTYPES.get(a.dtype.name, a.dtype.name)}>"


def stablehlo_text(module: str | bytes) -> str:
    """StableHLO text from text (returned as is) or a serialized portable artifact (bytes)."""
    if isinstance(module, str):
        return module
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    with ir.Context() as ctx:
        stablehlo.register_dialect(ctx)
        return str(stablehlo.deserialize_portable_artifact(ctx, bytes(module)))


def compile_stablehlo(
    module: str | bytes, platform: str = "cpu"
) -> Callable[..., list[np.ndarray]]:
    """Compile a StableHLO module with JAX's PJRT client; ``run(*arrays) -> [outputs]``.

    ``jax.extend.backend.get_backend(platform).compile_and_load`` takes the module as MLIR
    text; the returned function checks the inputs against ``@main``'s types first (XLA's own
    error for a wrong shape does not name the argument).
    """
    text = stablehlo_text(module)
    arg_types, _ = main_signature(text)
    return _compile_on_one_device(text, platform, arg_types)


def _compile_on_one_device(
    module: str | bytes, platform: str, arg_types: list[str] | None
) -> Callable[..., list[np.ndarray]]:
    """Compile MLIR text or bytecode for ``platform``'s first device; ``run(*arrays)``, which
    checks the inputs' types against ``arg_types`` first (None: no check)."""
    import jax
    from jax.extend import backend as jex_backend
    from jaxlib import xla_client

    client = jex_backend.get_backend(platform)
    device = client.local_devices()[0]
    options = jex_backend.get_compile_options(num_replicas=1, num_partitions=1)
    executable = client.compile_and_load(
        module, executable_devices=xla_client.DeviceList((device,)), compile_options=options
    )

    def run(*args: ArrayLike) -> list[np.ndarray]:
        got = [tensor_type(a) for a in args] if arg_types is not None else None
        if got != arg_types:
            raise ValueError(
                f"@main takes {arg_types}, got {got}: pass numpy arrays of those "
                "shapes and dtypes, in that order"
            )
        outs = executable.execute([jax.device_put(np.asarray(a), device) for a in args])
        return [np.asarray(o) for o in outs]

    return run


def tf_converter(saved_model: str | os.PathLike[str], input_shapes: str = "") -> bytes:
    """TensorFlow's SavedModel -> StableHLO converter (``savedmodel_to_stablehlo``): MLIR bytecode.

    ``input_shapes`` fixes the inputs' sizes (``"8,128"``; ``":"`` between inputs); empty keeps
    the signature's, ``None`` included.
    """
    from tensorflow.compiler.mlir.tensorflow_to_stablehlo.python import (
        pywrap_tensorflow_to_stablehlo as converter,
    )

    return bytes(
        converter.savedmodel_to_stablehlo(
            str(saved_model), ["serving_default"], ["serve"], input_shapes
        )
    )


def bytecode_text(module: bytes) -> str:
    """MLIR bytecode as text, in generic form (ops of dialects JAX does not load are kept)."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    with ir.Context() as ctx:
        ctx.allow_unregistered_dialects = True
        stablehlo.register_dialect(ctx)
        return str(ir.Module.parse(module))


def dialect_ops(text: str, dialect: str) -> list[str]:
    """The op names of one dialect in MLIR text (generic or pretty form), sorted, once each."""
    return sorted(set(re.findall(rf"\b({dialect}\.[a-z_]+)\b", text)))


def compile_bytecode(module: bytes, platform: str = "cpu") -> Callable[..., list[np.ndarray]]:
    """Compile MLIR bytecode (not a portable artifact) with JAX's PJRT client; ``run(*arrays)``."""
    return _compile_on_one_device(module, platform, None)


# ---------------------------------------------------------------------------------------
# SavedModel internals and the StableHLO Quantizer


@dataclasses.dataclass(frozen=True)
class XlaCallModule:
    """One ``XlaCallModule`` node of a SavedModel graph: a serialized StableHLO module."""

    function: str  # the graph function holding the node
    version: int  # the XlaCallModule calling-convention version
    platforms: tuple[str, ...]  # the platforms the module was lowered for (index = arg 0)
    module: bytes  # the StableHLO portable artifact

    @property
    def text(self) -> str:
        """The module as StableHLO text."""
        return stablehlo_text(self.module)


def xla_call_modules(saved_model: str | os.PathLike[str]) -> list[XlaCallModule]:
    """Every ``XlaCallModule`` in ``saved_model.pb`` (graph and function library)."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((Path(saved_model) / "saved_model.pb").read_bytes())
    found = []
    for meta in proto.meta_graphs:
        bodies = [("graph", meta.graph_def.node)]
        bodies += [(f.signature.name, f.node_def) for f in meta.graph_def.library.function]
        for name, nodes in bodies:
            for node in nodes:
                if node.op == "XlaCallModule":
                    attr = node.attr
                    platforms = tuple(s.decode() for s in attr["platforms"].list.s)
                    found.append(
                        XlaCallModule(name, attr["version"].i, platforms, attr["module"].s)
                    )
    return found


@dataclasses.dataclass
class NativeOutput:
    """What C++ code wrote to stdout and stderr inside :func:`quiet_tf`."""

    text: str = ""


@contextlib.contextmanager
def quiet_tf(level: int = logging.ERROR) -> Iterator[NativeOutput]:
    """Capture C++ output (file descriptors 1 and 2) and hold TF/absl Python logs below ``level``.

    The quantizer prints its report and harmless C++ log lines straight to the file
    descriptors, which a notebook shows as noise. They are kept in the yielded
    :class:`NativeOutput`; if the block raises, they are written to ``sys.stderr`` first so
    no real error is hidden. Python's ``print`` is not affected.
    """
    loggers = [logging.getLogger(n) for n in ("absl", "tensorflow")]
    levels = [lg.level for lg in loggers]
    out = NativeOutput()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as tmp:
        failed = True
        try:
            for lg in loggers:
                lg.setLevel(level)
            os.dup2(tmp.fileno(), 1)
            os.dup2(tmp.fileno(), 2)
            yield out
            failed = False
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            for lg, old in zip(loggers, levels, strict=True):
                lg.setLevel(old)
            tmp.seek(0)
            out.text = tmp.read().decode(errors="replace")
            if failed:
                print(out.text[-4000:], file=sys.stderr)


def drop_locations(text: str) -> str:
    """MLIR text without its debug locations: each ``loc(...)`` (nested parentheses and all)
    and the ``": "`` after it."""
    out, i = [], 0
    while (start := text.find("loc(", i)) >= 0:
        out.append(text[i:start])
        depth, quoted, j = 0, False, start + 3
        while j < len(text):
            char = text[j]
            j += 1
            if char == '"' and text[j - 2] != "\\":
                quoted = not quoted
            elif not quoted:
                depth += {"(": 1, ")": -1}.get(char, 0)
                if depth == 0:
                    break
        i = j + 2 if text.startswith(": ", j) else j
    return "".join(out) + text[i:]


def expect_error_line(
    *types: type[BaseException], match: str | None = None
) -> contextlib.AbstractContextManager[Caught]:
    """:func:`labkit.core.feedback.expect_error`, printing only the first line of the error,
    without MLIR debug locations. An XLA compile error of a TensorFlow module repeats the
    TensorFlow call stack in ``loc(...)`` notes; the whole message stays in the yielded
    ``Caught``."""
    return expect_error(*types, match=match, shown=lambda m: drop_locations(first_line(m)))


_CAPTURE_WARNING = "call_tf works best with a TensorFlow function that does not capture"


class _DropCaptureWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_CAPTURE_WARNING)


@contextlib.contextmanager
def quiet_call_tf() -> Iterator[None]:
    """Hide ``jax2tf.call_tf``'s warning about captured variables, and nothing else, in the block.

    ``labkit.export.from_tf`` lowers a TensorFlow function through ``jax2tf.call_tf``, which
    reads each variable the function captures once and writes its value into the module as a
    constant (``jax/experimental/jax2tf/call_tf.py``). It warns about every capture, with a
    dump of each variable's ``ResourceHandle``, because a JAX function built that way does not
    see later changes to those variables; an exported artifact is meant to freeze them.
    """
    logger = logging.getLogger("jax.experimental.jax2tf.call_tf")
    dropped = _DropCaptureWarning()
    logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)


@contextlib.contextmanager
def tf_temporary_files() -> Iterator[Path]:
    """Send TensorFlow's own temporary files to a folder removed when the block ends (also
    after an error): the quantizer writes a copy of the SavedModel, a calibration dump and
    the representative dataset (``*.tfrecord``) there and never removes them.

    TensorFlow's C++ side reads ``TMPDIR`` at each call; its Python side uses ``tempfile``.
    """
    saved_env, saved_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    with tempfile.TemporaryDirectory(prefix="labkit-tf-", ignore_cleanup_errors=True) as tmp:
        os.environ["TMPDIR"], tempfile.tempdir = tmp, tmp
        try:
            yield Path(tmp)
        finally:
            tempfile.tempdir = saved_dir
            if saved_env is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = saved_env


def quantization_report(text: str) -> list[dict[str, str]]:
    """The quantizer's report (``quantizable_unit { name }`` and ``method``) as rows."""
    rows = []
    for block in text.split("results {")[1:]:
        unit = re.search(r'quantizable_unit\s*\{\s*name:\s*"([^"]+)"', block)
        method = re.search(r"method\s*\{\s*(\w+)", block)
        if unit:
            rows.append({"unit": unit.group(1), "method": method.group(1) if method else "?"})
    return sorted(rows, key=lambda r: r["unit"])


def tf_dialect_ops(text: str) -> list[str]:
    """The TensorFlow-dialect op names (``"tf.MatMul"``...) in MLIR text, sorted, once each."""
    return sorted(set(re.findall(r'"(tf\.\w+)"', text)))


def int8_dots(text: str) -> list[str]:
    """The ``stablehlo.dot_general`` lines with int8 operands and an int32 result."""
    pattern = re.compile(r"\(tensor<[^>]*xi8>, tensor<[^>]*xi8>\) -> tensor<[^>]*xi32>")
    lines = [line.strip() for line in text.splitlines() if "stablehlo.dot_general" in line]
    return [line for line in lines if pattern.search(line)]


def to_int8_converts(text: str) -> int:
    """How many ``stablehlo.convert`` ops produce int8: the points where values are quantized."""
    lines = [line for line in text.splitlines() if "stablehlo.convert" in line]
    return sum(1 for line in lines if re.search(r"->\s*tensor<[^>]*xi8>", line))


def quantize_section(text: str, first: int = 0, last: int = 19) -> list[str]:
    """Lines ``%first`` to ``%last`` of ``@main`` (the input quantization and the first dot)."""
    keep = []
    for line in text.splitlines():
        m = re.match(r"\s*%(\d+) = ", line)
        if m and first <= int(m.group(1)) <= last:
            keep.append(line.strip())
    return keep


# ---------------------------------------------------------------------------------------
# Checkers


def check_static_batch_ir(answer: object, batch: int = 3, d_model: int = D_MODEL) -> Feedback:
    """02c.1: StableHLO text of the ``None``-batch function for a batch of ``batch`` rows."""
    if unanswered(answer):
        return judge("02c.1", answer, False, "", "")
    if not isinstance(answer, str):
        kind = type(answer).__name__
        return Feedback(
            "02c.1",
            False,
            True,
            f"expected the StableHLO text (a str), got "
            f"{kind}: call the generator with stage='stablehlo'",
        )
    try:
        args, results = main_signature(answer)
    except ValueError as err:
        return Feedback("02c.1", False, True, str(err))
    want = f"tensor<{batch}x{d_model}xf32>"
    ok = bool(args) and args[0] == want and results == [want]
    return judge(
        "02c.1",
        answer,
        ok,
        f"right: @main takes {args[0] if args else '?'} and the weights; the batch is static.",
        f"@main takes {args[:1]} and returns {results}; expected {want}: pass a concrete "
        f"tf.constant of shape ({batch}, {d_model}) to experimental_get_compiler_ir (a "
        "TensorSpec means the function's own signature, and its None is refused)",
    )


def check_quantize_points(answer: object, text: str) -> Feedback:
    """02c.2: how many ``convert`` ops in the quantized StableHLO produce int8."""
    expected = to_int8_converts(text)
    return check_integer(
        "02c.2",
        answer,
        expected,
        f"{expected}: the input, the first layer's output (before GELU), GELU's output (the "
        "second layer's input) and the second layer's output: static-range quantization gives "
        "every quantized op int8 inputs and an int8 output, each with a calibrated scale. The "
        "weights need no convert: they are stored as int8 constants.",
        "count the lines with stablehlo.convert whose result type ends in xi8> "
        "(labkit.lessons.n02c_export_tensorflow.to_int8_converts does it)",
    )


def check_platform_index(answer: object, platforms: tuple[str, ...] | list[str]) -> Feedback:
    """02c.3: the value of the quantized module's first argument that selects the CPU."""
    expected = list(platforms).index("CPU")
    return check_integer(
        "02c.3",
        answer,
        expected,
        f"{expected}: the first argument is an index into the module's platforms "
        f"{tuple(platforms)}; the caller passes the one it runs on.",
        f"the module was lowered for {tuple(platforms)}; arg 0 is the position of the "
        "platform you run on in that list (counting from 0)",
    )


def check_tf_matmul_op(answer: object, text: str) -> Feedback:
    """02c.p1 (predict): the StableHLO op TensorFlow writes for the MLP's matmuls."""
    ops = op_histogram(text)
    expected = "dot" if ops["stablehlo.dot"] >= ops["stablehlo.dot_general"] else "dot_general"
    spellings = {
        "dot": "dot",
        "stablehlo.dot": "dot",
        "dot_general": "dot_general",
        "stablehlo.dot_general": "dot_general",
    }
    return check_choice(
        "02c.p1",
        answer,
        expected,
        spellings,
        f"stablehlo.{expected}: the next cell counts the ops.",
        f"TensorFlow wrote stablehlo.{expected}; the next cell counts the ops",
    )
