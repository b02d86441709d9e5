"""Export your own model: one API for JAX, PyTorch and TensorFlow models, one artifact format.

Each front end returns a :class:`jax.export.Exported` with the model's weights inside it, so a
process that has only the saved file and ``jax`` calls it with the model's own inputs
(``exp.call(ids, attention_mask=mask)``):

- :func:`from_jax`: any callable or Flax NNX module, any pytree of inputs and dtypes, keyword
  arguments, dynamic dimensions named per argument or per leaf path in one symbolic scope,
  bounds included (``dynamic={"tokens": ("b, t", ["t <= 64"]), "params/scale": "n"}``). A
  module in training mode, or one that changes its state while computing, is refused.
- :func:`from_torch`: ``torch.export`` then torchax's JAX interpreter of the ATen graph, with
  dtypes, input names and keyword inputs kept, tied weights stored once, every dynamic
  dimension in one symbolic scope (bounds become ``torch.export.Dim(min=, max=)``; torch's
  suggested fixes come back in the same spec). Every submodule must be in eval mode.
- :func:`from_tf`: a ``tf.function``, a SavedModel directory (``model.export()`` writes one)
  or a Keras model (functional, Sequential or subclassed; a dict input by name), through
  TensorFlow's XLA bridge (``jax2tf.call_tf``); symbolic and bounded dimensions where they
  can be had (Keras on the JAX backend), a clear error naming the alternative where they
  cannot.

No dtype changes silently: with x64 off, float64 is refused (:class:`DtypeError` says how to
cast on purpose or how to export with x64), and int64 -> int32 is recorded in the sidecar.
Platform names are checked at export. The artifact format (:func:`save`, :func:`load`, the
checks, :func:`run_in_fresh_process`, :func:`describe`) lives in
:mod:`labkit.export.artifact` and is re-exported here, with the helpers the export lessons
share (:func:`max_rel_error`, :func:`main_signature`). Its SHA-256 sidecar detects a damaged
file, not a forged one (see :func:`load`).
"""

from labkit.export.artifact import (
    Artifact,
    ArtifactError,
    ExportInfo,
    FreshRun,
    InputShapeError,
    PlatformMismatch,
    call,
    check_inputs,
    check_platform,
    describe,
    load,
    needs_x64,
    provenance,
    read_sidecar,
    run_in_fresh_process,
    save,
    sidecar_path,
    symbol_bounds,
)
from labkit.export.common import (
    DtypeError,
    TrainingModeError,
    UnsupportedModelError,
    int_keys,
    main_signature,
    max_rel_error,
    string_keys,
)
from labkit.export.jax_models import from_jax, training_layers
from labkit.export.tf_models import from_tf
from labkit.export.torch_models import from_torch

__all__ = [
    "Artifact",
    "ArtifactError",
    "DtypeError",
    "ExportInfo",
    "FreshRun",
    "InputShapeError",
    "PlatformMismatch",
    "TrainingModeError",
    "UnsupportedModelError",
    "call",
    "check_inputs",
    "check_platform",
    "describe",
    "from_jax",
    "from_tf",
    "from_torch",
    "int_keys",
    "load",
    "main_signature",
    "max_rel_error",
    "needs_x64",
    "provenance",
    "read_sidecar",
    "run_in_fresh_process",
    "save",
    "sidecar_path",
    "string_keys",
    "symbol_bounds",
    "training_layers",
]
