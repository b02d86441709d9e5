"""Papermill parameters for ``labkit run``, checked per notebook before anything runs.

A notebook's ``parameters`` cell holds plain literals (``SIZES = [128, 256]  # comment``); their
values are the defaults a given value is checked against. Values are converted as papermill's
CLI converts them (``-p``: only ints, floats, True, False and None; ``-y``: YAML), so a check
here sees what the notebook would get.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from pathlib import Path

# Names that lessons gave two meanings' worth of spellings, renamed to one name per meaning
# (old -> new). ``labkit run`` still takes an old name for one release, for a notebook that has
# the new one and not the old: BATCH stays the name of one call's batch in 02b, 02c and 09.
# Plain papermill does not know this table: it would add the old name as an unused variable.
RENAMED = {"BATCH": "GLOBAL_BATCH", "STEPS": "TRAIN_STEPS"}


def defaults(notebook: Path) -> dict[str, object]:
    """``{NAME: default}`` of the notebook's ``parameters`` cell (empty without one).

    A default that is not a plain literal is ``...`` (nothing to check it against).
    """
    try:
        cells = json.loads(notebook.read_text()).get("cells", [])
    except (OSError, ValueError, AttributeError):
        return {}
    for cell in cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            try:
                tree = ast.parse("".join(cell.get("source", "")))
            except SyntaxError:
                return {}
            found: dict[str, object] = {}
            for node in tree.body:
                if isinstance(node, ast.Assign):
                    targets, value = node.targets, node.value
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    targets, value = [node.target], node.value
                else:
                    continue
                for target in targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = _literal(value)
            return found
    return {}


def new_name(name: str, notebooks: Sequence[Path]) -> str | None:
    """The name that replaced the old parameter name ``name`` in these notebooks, or None.

    None unless ``name`` is in :data:`RENAMED`, no notebook has it as a parameter, and every
    notebook has its new name.
    """
    new = RENAMED.get(name)
    if new is None or not notebooks:
        return None
    named = [defaults(notebook) for notebook in notebooks]
    return new if all(new in known and name not in known for known in named) else None


def _literal(node: ast.expr) -> object:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ...


def papermill_value(text: str) -> bool | int | float | str | None:
    """A ``-p NAME VALUE`` value as papermill's CLI converts it (its ``_resolve_type``)."""
    if text in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _kind(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return "True/False/None"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _leaves(value: object) -> list[object]:
    return [x for item in value for x in _leaves(item)] if isinstance(value, list) else [value]


def _counts(value: object) -> bool:
    """True if every leaf is a positive whole number (a size, a count, a number of steps)."""
    leaves = _leaves(value)
    return bool(leaves) and all(
        isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in leaves
    )


def _fits(value: object, default: object, top: bool = True) -> bool:
    """``value`` has the shape of ``default``: numbers for numbers, lists of like items.

    A text, True/False or None default takes anything on its own (the notebook checks a mode
    name itself); as a list item it takes its own kind (``[0, 4096, None]`` takes ints and None).
    """
    if isinstance(default, list):
        if not isinstance(value, list) or (default and not value):
            return False
        return not default or all(any(_fits(v, d, top=False) for d in default) for v in value)
    if isinstance(default, bool) or default is None or isinstance(default, str):
        return top or type(value) is type(default)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    return True


def problem(notebook: Path, name: str, value: object, how: str) -> str | None:
    """Why ``name = value`` does not suit this notebook (and what would), or None.

    ``how`` is the option as typed (``-p REPEATS 2.5``). A name must be one of the notebook's
    parameters; a value must have its default's kind (a whole number for a whole number, a
    list of like items for a list), and where the default is a positive count or a list of
    them, so must the value be (no zero batch, no negative size).
    """
    known = defaults(notebook)
    if name not in known:
        listed = ", ".join(known) or "none"
        renamed = RENAMED.get(name, "") in known
        return (
            f"{how}: {notebook.name} has no parameter {name} (its parameters: {listed}); "
            + (f"{name} is called {RENAMED[name]} there now; " if renamed else "")
            + "run the notebooks that take it on their own"
        )
    default = known[name]
    if default is ... or (_fits(value, default) and (_counts(value) or not _counts(default))):
        return None
    want = _kind(default)
    if _counts(default):
        many = isinstance(default, list)
        want = "a list of positive whole numbers" if many else "a positive whole number"
    said = (
        f"{how}: {notebook.name}'s {name} takes {want} like its default {default!r}; got {value!r}"
    )
    if isinstance(default, list) and isinstance(value, str):
        said += f" (-p passes text: give a list with -y, e.g. -y '{name}: {default!r}')"
    return said


def check(notebooks: Sequence[Path], given: Sequence[tuple[str, object, str]]) -> str | None:
    """The first problem of ``(name, value, as typed)`` with any of ``notebooks``, or None."""
    for notebook in notebooks:
        for name, value, how in given:
            if found := problem(notebook, name, value, how):
                return found
    return None
