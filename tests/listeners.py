"""Which TCP sockets listen on this machine's network, and a watch for new ones (``ss -ltn``).

The SLURM tests and the room's SLURM test check that nothing they start listens on an
address other machines could reach; sockets inside network namespaces the tests made are
not in this machine's network, so ``ss`` here does not list them.
"""

from __future__ import annotations

import ipaddress
import subprocess
import threading


def listeners() -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket in this machine's network (ss -ltn)."""
    out = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        local = line.split()[3]
        address, _, port = local.rpartition(":")
        found.add((address.strip("[]").split("%")[0], int(port)))
    return found


def off_loopback(seen: set[tuple[str, int]]) -> set[tuple[str, int]]:
    """The listeners of ``seen`` on an address other machines could reach (not loopback)."""
    return {
        (a, p) for a, p in seen if not ipaddress.ip_address(a.removeprefix("::ffff:")).is_loopback
    }


class ListenerWatch:
    """Samples ``ss -ltn`` every 0.3 s in a thread; ``new`` is every non-loopback listener
    seen that was not there before the watch began (this machine's own are left out)."""

    def __init__(self) -> None:
        self.before = off_loopback(listeners())
        self.new: set[tuple[str, int]] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._done.wait(0.3):
            self.new |= off_loopback(listeners()) - self.before

    def __enter__(self) -> ListenerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.new |= off_loopback(listeners()) - self.before
