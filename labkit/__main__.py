"""``python -m labkit``: the ``labkit`` command (:mod:`labkit.cli`)."""

import sys

try:
    from labkit.cli import main
except (ImportError, SyntaxError) as exc:  # a broken or foreign install: say what to do
    sys.exit(
        f"error: labkit cannot start with {sys.executable}: {exc}. In the kit's folder run "
        "`make setup`, then `.venv/bin/labkit ...` (or `make doctor`)."
    )

if __name__ == "__main__":
    sys.exit(main())
