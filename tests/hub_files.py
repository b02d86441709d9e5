"""What the lab room's tests share: where the room's files are, its scripts loaded as modules,
and whether a system account exists (the room makes learners' accounts and removes them)."""

from __future__ import annotations

import importlib.util
import pwd
import subprocess
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
HUB = ROOT / "tools" / "hub"
HUB_ENV = ROOT / ".venv-hub"
HUB_PYTHON = HUB_ENV / "bin" / "python"
HUBCTL = HUB / "hubctl.py"


def load(name: str) -> ModuleType:
    """A fresh copy of the module ``tools/hub/<name>.py`` (they are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"labkit_hub_{name}", HUB / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def account_exists(name: str) -> bool:
    """Whether the system user ``name`` exists."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def unreadable_by(path: Path, user: pwd.struct_passwd) -> bool:
    """Whether ``user`` (with no supplementary groups) is refused reading ``path``."""
    peek = subprocess.run(
        ["cat", str(path)],
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        check=False,
    )
    return peek.returncode != 0 and "Permission denied" in peek.stderr
