"""Small notebooks written by tests: code cells for the kit's own kernel (``python3``)."""

from __future__ import annotations

from pathlib import Path

import nbformat


def code_notebook(
    cells: list[str], path: Path | None = None, parameters: str | None = None
) -> nbformat.NotebookNode:
    """A notebook of ``cells`` (code), with a papermill ``parameters`` cell first if given;
    written to ``path`` when one is given."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    if parameters is not None:
        cell = nbformat.v4.new_code_cell(parameters)
        cell.metadata["tags"] = ["parameters"]
        nb.cells.insert(0, cell)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    if path is not None:
        nbformat.write(nb, path)
    return nb


# A lab kernel at work, in a few seconds: what the browser and room tests run instead of a
# whole lesson (the lessons themselves run under papermill and nbval in tests/test_notebooks.py).
# It sets up 8 CPU devices, sums over them, compiles a collective for 8 H100s, draws a plot
# and runs lesson 00's two checkers on unanswered exercises (so the room records "to do").
KERNEL_CHECK_PARAMETERS = 'MODE = "cpu"  # the tests have no GPU'
KERNEL_CHECK_CELLS = [
    "from labkit.core.env import setup, show\n\n"
    "SETUP = setup(cpu_devices=8, mode=MODE)\n"
    "ENV = show()",
    "import jax\n"
    "import jax.numpy as jnp\n"
    "import matplotlib.pyplot as plt\n"
    "from jax.sharding import NamedSharding, PartitionSpec\n"
    "\n"
    "from labkit.core.feedback import claim\n"
    "from labkit.core.mesh import abstract, make_mesh\n"
    "from labkit.lessons.n00_welcome import check_all_reduce_count, check_ridge_matmul_size\n"
    "from labkit.xla import aot, hlo",
    'mesh = make_mesh((8,), ("data",))\n'
    'x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, PartitionSpec("data")))\n'
    'claim("a sum over the 8 devices", float(jax.jit(jnp.sum)(x)), 28.0)',
    'h100 = aot.h100_mesh((8,), ("data",))\n'
    'spec = abstract(jnp.zeros((8, 128), jnp.float32), h100, PartitionSpec("data"))\n'
    "program = aot.compile_for_gpu(lambda v: v.sum(axis=0), spec)\n"
    'claim("the sum compiled for 8 H100s all-reduces", hlo.collective_counts(program.hlo).get('
    '"all-reduce", 0) >= 1)',
    "fig, ax = plt.subplots(figsize=(4, 3))\n"
    'ax.bar(range(8), [float(v) for v in x])\nax.set_xlabel("device")\nplt.show()',
    "display(check_ridge_matmul_size(None))\ndisplay(check_all_reduce_count(None, program.hlo))",
]


def kernel_check_notebook(path: Path | None = None) -> nbformat.NotebookNode:
    """The kernel check (:data:`KERNEL_CHECK_CELLS`), written to ``path`` when given."""
    return code_notebook(KERNEL_CHECK_CELLS, path, parameters=KERNEL_CHECK_PARAMETERS)
