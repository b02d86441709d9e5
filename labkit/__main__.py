"""``python -m labkit``: the command line (:mod:`labkit.cli`)."""

import sys

from labkit.cli import main

if __name__ == "__main__":
    sys.exit(main())
