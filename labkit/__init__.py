"""labkit: the helper package of the OpenXLA GPU Lab Kit.

Layers, each importing only those before it (a test keeps it so):

- ``labkit.core``: process setup, the hardware table, meshes, timing, reports, feedback.
- ``labkit.xla``: HLO reading and comparison, deviceless GPU compiles, XLA flags.
- the topic subpackages, one per subject several lessons share; each stands on core and xla
  alone and knows no model:

  - ``labkit.runtime``: PJRT plugins, the C API driven by hand, a wrapping plugin, XLA:GPU's
    thunks and command buffers;
  - ``labkit.export``: models from JAX, PyTorch and TensorFlow to ``jax.export`` artifacts, the
    saved artifact and its sidecar, IREE as a second consumer;
  - ``labkit.parallel``: sharding rules and ring formulas, processes on one machine, cluster
    recipes, sharded checkpoints;
  - ``labkit.numerics``: number formats, error metrics, dtype policies, FP8 scaling;
  - ``labkit.kernels``: Pallas kernels, flash and cuDNN attention, compiled kernels' code.

- ``labkit.gpt``: the small GPT (config, model, training, corpus) and its compile entry.
- ``labkit.lessons``: one module per notebook (its helpers, checkers and widgets).
- ``labkit.runner``: notebooks executed headless with the papermill CLI, the preflight report,
  what a notebook was doing at its timeout; it stands on core alone (tests and tools use it).
- ``labkit.cli``: the ``labkit`` command, one module per command.

Import functions by name (``from labkit.xla.hlo import collectives``). Importing labkit does
not import JAX: call ``labkit.core.env.setup(...)`` first in every notebook and script.
"""

__version__ = "0.1.0"
