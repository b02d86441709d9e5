"""labkit: the helper package of the OpenXLA GPU Lab Kit.

Layers, each importing only those before it (a test keeps it so):

- ``labkit.core``: process setup, the hardware table, meshes, timing, reports, feedback.
- ``labkit.xla``: HLO reading and comparison, deviceless GPU compiles, XLA flags.
- topic modules shared by several lessons: ``labkit.sharding``.
- ``labkit.gpt``: the small GPT (config, model, training, corpus) and its compile entry.
- ``labkit.lessons``: one module per notebook (its helpers, checkers and widgets).
- ``labkit.cli``: the command line and the preflight runner.

Import functions by name (``from labkit.xla.hlo import collectives``). Importing labkit does
not import JAX: call ``labkit.core.env.setup(...)`` first in every notebook and script.
"""

__version__ = "0.1.0"
