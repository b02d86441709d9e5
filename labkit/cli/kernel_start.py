"""The lab's kernel: ipykernel, started after a check of ``XLA_FLAGS``.

``labkit kernel install`` writes a kernel spec that runs ``python -m labkit.cli.kernel_start``
instead of ``python -m ipykernel_launcher``. XLA aborts the process at JAX's first operation
when ``XLA_FLAGS`` holds a flag it refuses: in JupyterLab that is a dead kernel, restarted
five times, in ``nbconvert --execute`` "Kernel died". Here the flags are checked first
(``labkit flags check``, cached per jaxlib); when they would abort JAX, the kernel starts
without them and the first cell that runs shows the check's table and what to do. Good flags,
or none, cost nothing and change nothing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

RESTART = (
    "This kernel started without XLA_FLAGS so that JAX can run. Fix or unset XLA_FLAGS where "
    "Jupyter was started (in make lab: in that shell, then restart make lab), or set flags in "
    "the notebook with labkit.core.env.setup(xla_flags=...)."
)


def problem() -> str | None:
    """What to show when ``$XLA_FLAGS`` would abort JAX (and remove it), else None."""
    from labkit.core.env import xla_flags_problem

    said = xla_flags_problem(os.environ.get("XLA_FLAGS", ""))
    if said is None:
        return None
    del os.environ["XLA_FLAGS"]
    return f"{said}\n\n{RESTART}"


def main() -> None:
    """Check ``XLA_FLAGS``, then run ipykernel as ``ipykernel_launcher`` does."""
    if sys.path[0] == "" or Path(sys.path[0]) == Path.cwd():
        del sys.path[0]  # as ipykernel_launcher: the kernel puts the working directory back
    message = problem() if os.environ.get("XLA_FLAGS", "").strip() else None
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize(sys.argv[1:])
    if message is not None and app.shell is not None:
        shown: list[bool] = []

        def show(*_: object) -> None:
            if not shown:  # once, in the output of the first cell run
                shown.append(True)
                print(message, file=sys.stderr)

        app.shell.events.register("pre_run_cell", show)
    app.start()


if __name__ == "__main__":
    main()
