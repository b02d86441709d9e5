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


# The kit's pictures in a few seconds: what the browser test renders in JupyterLab instead of
# running 03, 06 and 08 whole (minutes of compiles). Each cell calls the drawing those lessons
# call, on small inputs: 03's layout of an array and its matmul explorer, the memory bars of
# 03 and 08, 06's threshold sweep, 08's predicted ranges, 00's roofline; then a table and a
# recorded figure. PICTURES lists what each picture must show: its title and, for the SVG
# grids, how many blocks.
PICTURES_CELLS = [
    KERNEL_CHECK_CELLS[0],
    "import jax\n"
    "import jax.numpy as jnp\n"
    "from jax.sharding import NamedSharding\n"
    "from jax.sharding import PartitionSpec as P\n"
    "\n"
    "from labkit.core.figures import bars\n"
    "from labkit.core.mesh import make_mesh\n"
    "from labkit.core.report import record, show_table\n"
    "from labkit.core.timing import RooflinePoint\n"
    "from labkit.lessons.n00_welcome import roofline_picture\n"
    "from labkit.lessons.n03_sharding import matmul_explorer\n"
    "from labkit.lessons.n06_collective_flags import SweepRow, sweep_picture\n"
    "from labkit.parallel import sharding\n"
    "from labkit.xla import memory",
    'mesh = make_mesh((4, 2), ("data", "model"))\n'
    'x = jax.device_put(jnp.zeros((16, 32)), NamedSharding(mesh, P("data", "model")))\n'
    'sharding.show(x, "x")',
    "matmul_explorer()",
    'held = {"dp": memory.Memory(1_630_000, 1_630_000, 1_630_000, 4_880_000, 0, None),\n'
    '        "fsdp": memory.Memory(205_000, 205_000, 205_000, 5_140_000, 0, None)}\n'
    'memory.picture(held, "Memory per device", limits={"LIMIT": 5.9e6})',
    "rows = [SweepRow(0, 'all-reduce', 26, 540_000, 20_769.0, 131_072, ()),\n"
    "        SweepRow(31_457_280, 'all-reduce', 1, 540_000, 540_000.0, 540_000, (), True)]\n"
    'sweep_picture({"DP": rows}, "Combine thresholds")',
    'ranges = {"dp/f32": (173.0, 178.0), "dp/bf16": (188.0, 188.0)}\n'
    'bars("Predicted step per configuration", ranges, "predicted step (us)", "config",\n'
    '     unit="us")',
    'points = [RooflinePoint(128, "float32", 1e-4, 0.04, 21.3),\n'
    '          RooflinePoint(256, "float32", 5e-4, 0.07, 42.7)]\n'
    'roofline_picture(points, "cpu")',
    'show_table([{"kind": "all-reduce", "bytes": 1024}], ["kind", "bytes"], caption="a table")\n'
    'record("pictures_drawn", 6)',
]
# (title, blocks of an SVG grid or None for a plot), in page order
PICTURES = [
    ("How x is laid out", 8),
    ("x @ w on a mesh of x 8: no collective", 8 + 1 + 8),
    ("Memory per device", None),
    ("Combine thresholds", None),
    ("Predicted step per configuration", None),
    ("Roofline: H100 SXM roofs, cpu measured", None),
]


def pictures_notebook(path: Path | None = None) -> nbformat.NotebookNode:
    """The pictures check (:data:`PICTURES_CELLS`), written to ``path`` when given."""
    return code_notebook(PICTURES_CELLS, path, parameters=KERNEL_CHECK_PARAMETERS)
