"""The notebook runner: notebooks executed headless with the plain papermill CLI.

- ``labkit.runner.preflight``: find the lab's notebooks, execute one (its exit code is the
  verdict, within a whole-notebook time limit, in a temporary folder of its own), run many
  into a report folder (``report.md``, ``report.json``), keep the outputs nbval checks.
- ``labkit.runner.stuck``: what a notebook was doing when its time ran out, and a clean stop
  of papermill, its kernel and their children.

``labkit run`` and ``labkit outputs`` (:mod:`labkit.cli`), the notebook tests and
``tools/slides.py`` run notebooks through it. It stands on ``labkit.core`` alone and never
imports JAX: each notebook runs in a kernel of its own.
"""
