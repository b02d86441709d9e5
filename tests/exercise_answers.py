"""Is an exercise's answer printed above it? Read from an executed lesson and its solution.

A solution stores each answer as ``answer_NN_k = <expression>`` (a prediction as
``prediction_NN_k``). The answer's printed forms (``7340032``, ``7,340,032``, ``0.875``, a
repr) must not appear in the outputs of the lesson cells above the exercise. The answers come
two ways: where the expression is a literal or arithmetic on literals, from the solution's
text (:func:`stored_answers`); every answer a checker accepts, computed or not, from the log
a solution run writes (``LABKIT_ANSWER_LOG``, :func:`logged_answers`). Integers under 100
are not looked for: a ``3`` or a ``64`` is in every output.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections.abc import Callable
from pathlib import Path

import nbformat

ANSWER = re.compile(r"^((?:answer|prediction)_\w+)\s*=", re.MULTILINE)
LITERAL = re.compile(r"^answer_\w+$")  # predictions are mostly choices: only logged ones count
_OPS: dict[type, Callable[[object, object], object]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}


def evaluate(node: ast.expr) -> object:
    """The value of a literal or of arithmetic on literals; ValueError for anything else."""
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](evaluate(node.left), evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -evaluate(node.operand)  # type: ignore[operator]
    return ast.literal_eval(node)


def stored_answers(solution: Path) -> dict[str, object]:
    """``{answer name: value}`` for each answer a solution stores as a literal expression."""
    out = {}
    for cell in nbformat.read(solution, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        for node in ast.parse(cell.source).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name) and LITERAL.match(target.id):
                    try:
                        out[target.id] = evaluate(node.value)
                    except (ValueError, TypeError, SyntaxError):
                        pass  # computed in the solution: not known here
    return out


def printed_forms(value: object) -> list[str]:
    """The ways a lesson would print ``value``; empty for values too common to mean anything."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int | float):
        if float(value).is_integer():
            n = int(value)
            return [] if abs(n) < 100 else [str(n), f"{n:,}"]
        return [f"{value:g}", repr(value)]
    if isinstance(value, str):
        return [value] if len(value) >= 4 else []
    return [repr(value)]


def _text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        for kind in ("text/plain", "text/markdown"):
            parts.append(out.get("data", {}).get(kind, ""))
    return "\n".join(parts)


def _found(form: str, text: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(form)}(?![\w]|\.\d)", text) is not None


def code_cells(notebook: Path) -> list[nbformat.NotebookNode]:
    """A notebook's code cells, in order."""
    return [c for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]


def variable_of(exercise: str) -> str:
    """The variable a lesson asks for: ``00.1`` -> ``answer_00_1``, ``08.p1`` ->
    ``prediction_08_1``."""
    lesson, _, number = exercise.partition(".")
    if number.startswith("p"):
        return f"prediction_{lesson}_{number[1:]}"
    return f"answer_{lesson}_{number}"


def logged_answers(log: Path) -> dict[str, object]:
    """``{variable: answer}`` from a ``LABKIT_ANSWER_LOG`` file (the last accepted answer of
    each exercise); one logged as its type only (a compiled program) or a choice among named
    options (printed by design) is None: nothing to look for."""
    out: dict[str, object] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        entry = json.loads(line)
        answer = entry["answer"]
        looked_for = not entry["choice"] and not isinstance(answer, dict)  # dict: type only
        out[variable_of(entry["exercise"])] = answer if looked_for else None
    return out


def printed_above(executed: Path, solution: Path | dict[str, object]) -> list[str]:
    """Each exercise of the executed lesson whose answer its earlier outputs print: the
    answers a solution stores as literals, or ``{variable: answer}``."""
    answers = stored_answers(solution) if isinstance(solution, Path) else solution
    cells = code_cells(executed)
    found = []
    for i, cell in enumerate(cells):
        for name in ANSWER.findall(cell.source):
            above = "\n".join(_text(c) for c in cells[:i])
            hits = [f for f in printed_forms(answers.get(name)) if _found(f, above)]
            if hits:
                found.append(f"{executed.name}: {name} = {hits[0]} is printed above it")
    return found
