"""Headless Chromium for the browser tests: Debian's /usr/bin/chromium driven by Playwright.

Playwright's own browser download is never used (``playwright install`` cannot reach its
server here): the tests launch the system Chromium through ``executable_path``. Without it,
or without the ``playwright`` package, the browser tests are skipped with the reason and the
fix (``make browser-deps``, which ``make test`` runs first, installs Chromium as root).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = os.environ.get("LABKIT_CHROMIUM", "/usr/bin/chromium")
# As root Chromium needs --no-sandbox; the others keep it off this closed network (no
# background requests to Google's services, no QUIC) and off the GPU.
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def skip_reason() -> str | None:
    """Why the browser tests cannot run here (with the fix), or None when they can."""
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed: run `make setup` (the test extra pins it)"
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        return (
            f"no Chromium at {CHROMIUM}: run `make browser-deps` as root (Debian's chromium "
            "package), or set LABKIT_CHROMIUM to a Chromium binary"
        )
    return None


needs_chromium = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


@contextmanager
def browser() -> Iterator[Any]:
    """A headless Chromium (Playwright ``Browser``), always closed, with its driver."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


class PageLog:
    """What a page did: console errors, uncaught exceptions, and every request's URL."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        self.requests: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        page.on("request", lambda r: self.requests.append(r.url))

    def outside(self, *schemes: str) -> list[str]:
        """Requests whose URL starts with none of ``schemes`` (data: URLs are inline)."""
        return [u for u in self.requests if not u.startswith((*schemes, "data:"))]
