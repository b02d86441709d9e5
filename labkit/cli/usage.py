"""A usage problem of the ``labkit`` command: what it was given cannot be used."""

from __future__ import annotations


class UsageError(Exception):
    """What a command was given cannot be used: ``labkit`` prints ``error: MESSAGE`` and exits 2.

    Raised before any work starts (nothing ran); the message says what was wrong and what to
    do, and may hold more lines (the notebooks that exist, a flag's verdict).
    """
