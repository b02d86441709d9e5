"""XLA flags for the GPU lab: what they do, whether this jaxlib takes them, how to try them.

An unknown name in ``XLA_FLAGS`` kills the process at JAX's first operation (a Jupyter kernel
dies), so every check runs in a fresh subprocess and this module never imports JAX. The CPU
jaxlib parses ``xla_gpu_*`` flags too. Defaults come from the installed jaxlib: the text of
the ``DebugOptions`` proto that ``jaxlib.xla_client.CompileOptions()`` builds. A compile
under ``XLA_FLAGS`` runs in a child process: :func:`run_compile_child` starts it and reads
what the child's :func:`report_compile` wrote.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, NotRequired, TypedDict, cast

from labkit.core.env import cache_dir, remember_accepted_xla_flags
from labkit.core.report import markdown_table
from labkit.core.types import JSON
from labkit.xla.flag_registry import (
    RECOMMENDED_2023,
    RECOMMENDED_2023_SOURCE,
    REGISTRY,
    REMOVED,
    RESULT_MARKER,
    UNSET,
    Flag,
    FlagError,
    Removed,
    Status,
    X,
    compile_options,
    default_text,
    join_flags,
    parse,
    split,
    typed_value,
)

__all__ = [
    "RECOMMENDED_2023",
    "RECOMMENDED_2023_SOURCE",
    "REGISTRY",
    "REMOVED",
    "RESULT_MARKER",
    "UNSET",
    "Flag",
    "FlagCompile",
    "FlagError",
    "ProbeError",
    "Removed",
    "SubprocessResult",
    "Verdict",
    "compile_options",
    "default_of",
    "describe",
    "emit",
    "installed_defaults",
    "jaxlib_version",
    "parse",
    "report_compile",
    "run_compile_child",
    "run_with_flags",
    "split",
    "table",
    "validate",
]


class ProbeError(RuntimeError):
    """The checking subprocess failed for a reason other than the flags."""


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the installed jaxlib makes of one ``--name=value`` token."""

    token: str
    name: str
    value: str
    status: Status
    message: str
    suggestion: str | None = None  # the closest known name, for misspellings
    replacement: str | None = None  # for removed flags
    effect: tuple[tuple[str, str], ...] = ()  # (DebugOptions field, new value) pairs
    per_compile: bool = False  # also accepted as a jax ``compiler_options`` key

    @property
    def would_abort(self) -> bool:
        """True when this token in XLA_FLAGS kills the process at JAX's first operation."""
        return self.status != "ok"


@dataclasses.dataclass(frozen=True)
class SubprocessResult:
    """A finished :func:`run_with_flags` process and the JSON it emitted (or None)."""

    returncode: int
    stdout: str
    stderr: str
    result: JSON
    seconds: float
    xla_flags: str


_PROBE = """
import json, sys
import numpy as np
import jax
import jaxlib.xla_client as xc
jax.devices()  # starts the backend, which parses XLA_FLAGS: a bad flag aborts here
quiet = {"xla_enable_dumping": False}  # checking never writes dumps
lowered = jax.jit(lambda x: x * 2 + 1).lower(jax.ShapeDtypeStruct((2,), np.float32))
lowered.compile(compiler_options=quiet)(np.ones(2, np.float32)).block_until_ready()
per_compile = {}
for token, name, value in json.loads(sys.argv[1]):
    try:
        lowered.compile(compiler_options={**quiet, name: value})
        per_compile[token] = ""
    except Exception as exc:  # XLA's JaxRuntimeError, reported as text
        per_compile[token] = str(exc).splitlines()[0]
options = xc.CompileOptions()
build = options.executable_build_options  # keep `options` alive: this points into it
result = {"per_compile": per_compile, "debug_options": str(build.debug_options)}
print("MARKER" + json.dumps(result))
""".replace("MARKER", RESULT_MARKER)


class _Entry(TypedDict):
    """What one probed token did (kept per jaxlib version in the cache file)."""

    status: Literal["ok", "unknown", "bad_value"]
    xla: NotRequired[str]  # XLA's complaint, for "unknown" and "bad_value"
    needs_value: NotRequired[bool]  # a bare --name that XLA knows with a value
    per_compile: NotRequired[str]  # "" when compiler_options take it, else XLA's first line
    effect: NotRequired[dict[str, str]]  # DebugOptions field -> new value


class _Payload(TypedDict):
    """What the probe process prints after RESULT_MARKER."""

    per_compile: dict[str, str]
    debug_options: str


class _State(TypedDict):
    """The cache file: the installed defaults and every token probed so far."""

    schema: int
    defaults: dict[str, str] | None
    tokens: dict[str, _Entry]


_STATE: dict[str, _State] = {}  # cache file -> its state


def jaxlib_version() -> str:
    """The installed jaxlib's version, read without importing it."""
    try:
        return importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _state() -> tuple[Path, _State]:
    path = cache_dir() / f"flags-{jaxlib_version()}.json"
    if str(path) not in _STATE:
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            state = {}
        if state.get("schema") != 1:  # missing, or written by another labkit version
            state = {"schema": 1, "defaults": None, "tokens": {}}
        _STATE[str(path)] = state
    return path, _STATE[str(path)]


def _save() -> None:
    path, state = _state()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written costs time only: verdicts stay in memory


def _spawn(
    cmd: Sequence[str], env: Mapping[str, str], timeout_s: float, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout_s)


def _result_of(stdout: str) -> JSON:
    lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT_MARKER)]
    try:
        return json.loads(lines[-1][len(RESULT_MARKER) :]) if lines else None
    except ValueError as exc:
        raise ValueError(f"{RESULT_MARKER}line is not JSON ({exc}): {lines[-1][:200]}") from None


def _options(text: str) -> dict[str, str]:
    """DebugOptions text format -> {field: value}; repeated fields joined by commas."""
    found: dict[str, list[str]] = {}
    block = ""
    for line in (ln.strip() for ln in text.splitlines()):
        if line.endswith("{") or line == "}":
            block = line[:-1].strip()
        elif ":" in line:
            key, _, value = (s.strip() for s in line.partition(":"))
            value = value[1:-1] if len(value) > 1 and value[0] == value[-1] == '"' else value
            found.setdefault(block or key, []).append(f"{key}:{value}" if block else value)
    return {k: ",".join(v) for k, v in found.items()}


def _run_probe(tokens: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="labkit-flags-") as tmp:
        # Any path is a valid --xla_dump_to; a temporary one keeps checking from writing dumps.
        probed = [f"--xla_dump_to={tmp}" if t.startswith("--xla_dump_to=") else t for t in tokens]
        items = []
        for token, (name, value) in zip(tokens, parse(probed), strict=True):
            try:
                items.append([token, name, typed_value(name, value)])
            except ValueError:
                items.append([token, name, value])
        env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
        env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="1", XLA_FLAGS=join_flags(probed))
        try:
            return _spawn([sys.executable, "-c", _PROBE, json.dumps(items)], env, timeout_s)
        except subprocess.TimeoutExpired:
            raise ProbeError(f"checking XLA flags took over {timeout_s:g} s: {tokens}") from None


def _blame(stderr: str, pending: Sequence[str]) -> dict[str, _Entry]:
    """Tokens that XLA's log names as unknown or as having a value it cannot read."""
    blamed: dict[str, _Entry] = {}
    for text in (ln.split("] ", 1)[-1] for ln in stderr.splitlines()):
        unknown = re.search(r"Unknown flags? in XLA_FLAGS: (.*)", text)
        bad = re.search(r"Couldn't interpret value .* for flag (\w+)\.", text)
        for token in pending:
            name = token[2:].partition("=")[0]
            if unknown and re.search(rf"(?<!\S)--{name}(?!\w)", unknown.group(1)):
                blamed[token] = {"status": "unknown", "xla": text}
            elif bad and bad.group(1) == name:
                blamed[token] = {"status": "bad_value", "xla": text}
    return blamed


def _probe(tokens: Sequence[str], timeout_s: float) -> dict[str, _Entry]:
    """Try all ``tokens`` in one process; on failure blame those XLA names, else bisect.

    With no tokens, the one entry ``""`` holds the installed defaults as its ``effect``."""
    results: dict[str, _Entry] = {}
    pending = list(tokens)
    while True:
        proc = _run_probe(pending, timeout_s)
        payload = _result_of(proc.stdout) if proc.returncode == 0 else None
        if payload is not None:  # the probe above prints a _Payload
            return results | _accepted(pending, cast("_Payload", payload), timeout_s)
        if not pending:  # no flags and still a failure: the environment is broken, not a flag
            raise ProbeError(
                f"JAX failed to start (exit {proc.returncode}):\n{proc.stderr[-2000:]}"
            )
        blamed = _blame(proc.stderr, pending)
        if not blamed and len(pending) > 1:
            half = len(pending) // 2
            return results | _probe(pending[:half], timeout_s) | _probe(pending[half:], timeout_s)
        if not blamed:  # one token, not named by XLA: a list item, or JAX failed to start
            errors = re.findall(r"^\w[\w.]*(?:Error|Exception): .*$", proc.stderr, re.M)
            why = "XLA's flag parser failed without naming it (check each item of a list)"
            why = errors[-1] if errors and "Flag parsing failed" not in proc.stderr else why
            blamed = {pending[0]: {"status": "bad_value", "xla": why}}
        results |= blamed
        pending = [t for t in pending if t not in blamed]
        if not pending:
            return results


def _accepted(tokens: Sequence[str], payload: _Payload, timeout_s: float) -> dict[str, _Entry]:
    """Per token: what it changed in DebugOptions and whether compiler_options take it."""
    after = _options(payload["debug_options"])
    if not tokens:
        return {"": {"status": "ok", "effect": after}}
    before = installed_defaults()
    changed = {k: v for k, v in after.items() if before.get(k) != v}
    changed |= {k: "" for k in before if k not in after}  # a repeated field emptied
    per = payload["per_compile"]
    targets: dict[str, str | None] = {}  # token -> the DebugOptions field it aims at
    for t in tokens:
        name = t[2:].partition("=")[0]
        field = REGISTRY[name].field if name in REGISTRY else ""
        targets[t] = name if "No such compile option" not in per[t] else field or None
    aimed = list(targets.values())
    results: dict[str, _Entry] = {}
    rounds: dict[int, list[str]] = {}
    for t, target in targets.items():
        if len(tokens) > 1 and aimed.count(target) > 1:  # tokens sharing a target: re-probe
            seen = [u for u in targets if targets[u] == target].index(t)  # in rounds
            rounds.setdefault(seen, []).append(t)
            continue
        if target == "xla_dump_to":
            effect = {target: t.partition("=")[2]}  # probed with a temporary directory
        elif target:
            effect = {target: changed[target]} if target in changed else {}
        else:  # an old name that sets no field of its own name: all changes no token explains
            effect = {k: v for k, v in changed.items() if k not in aimed}
        results[t] = {"status": "ok", "per_compile": per[t], "effect": effect}
    for batch in rounds.values():
        results |= _probe(batch, timeout_s)
    return results


def installed_defaults(timeout_s: float = 120.0) -> dict[str, str]:
    """Every DebugOptions field the installed jaxlib sets by default; cached per version."""
    _, state = _state()
    defaults = state["defaults"]
    if defaults is None:
        defaults = state["defaults"] = _probe([], timeout_s)[""].get("effect", {})
        _save()
    return defaults


def _suggest(name: str) -> str | None:
    names = sorted(set(installed_defaults()) | set(REGISTRY))
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.8)
    return close[0] if close else None


def validate(flags: str | Sequence[str], timeout_s: float = 120.0) -> list[Verdict]:
    """What the installed jaxlib makes of each flag, tried in subprocesses; never aborts."""
    pairs = parse(flags)
    tokens = split(flags)  # as typed: XLA reads a bare --name only for true/false flags
    installed_defaults(timeout_s)
    _, state = _state()
    todo = [t for t in dict.fromkeys(tokens) if t not in state["tokens"]]
    if todo:
        found = _probe(todo, timeout_s)
        state["tokens"].update(found | _needs_value(found, timeout_s))
        _save()
    verdicts = [
        _verdict(n, v, t, state["tokens"][t]) for (n, v), t in zip(pairs, tokens, strict=True)
    ]
    return _last_wins(verdicts)


def _last_wins(verdicts: list[Verdict]) -> list[Verdict]:
    """Verdicts with a note on each flag given more than once: XLA keeps its last value."""
    names = [v.name for v in verdicts]
    out = []
    for at, v in enumerate(verdicts):
        times = names.count(v.name)
        if times == 1:
            out.append(v)
            continue
        last = at == len(names) - 1 - names[::-1].index(v.name)
        note = (
            f"given {times} times: this last one wins (XLA keeps the last value)"
            if last
            else f"given {times} times: a later --{v.name} overrides this one (the last wins)"
        )
        out.append(dataclasses.replace(v, message=f"{note}; {v.message}"))
    return out


def table(verdicts: Sequence[Verdict]) -> str:
    """The verdicts as ``labkit flags check`` prints them: a flag | verdict | note table."""
    rows: list[dict[str, JSON]] = [
        {"flag": v.token, "verdict": v.status, "note": v.message} for v in verdicts
    ]
    return markdown_table(rows, ["flag", "verdict", "note"])


def _needs_value(found: Mapping[str, _Entry], timeout_s: float) -> dict[str, _Entry]:
    """Bare ``--name`` tokens that XLA calls unknown although it knows ``--name=``: a string,
    number or list flag written without its value (``--xla_dump_to``)."""
    bare = [t for t, entry in found.items() if "=" not in t and entry["status"] == "unknown"]
    valued = _probe([f"{t}=" for t in bare], timeout_s) if bare else {}
    return {
        t: {"status": "bad_value", "xla": found[t]["xla"], "needs_value": True}
        for t in bare
        if valued[f"{t}="]["status"] != "unknown"
    }


def _verdict(name: str, value: str, token: str, entry: _Entry) -> Verdict:
    lib, status, removed = f"jaxlib {jaxlib_version()}", entry["status"], REMOVED.get(name)
    if status == "unknown" and removed:
        note = f"removed ({lib} rejects it, JAX would abort); instead: {removed.replacement}"
        return Verdict(token, name, value, "removed", note, replacement=removed.replacement)
    if status == "unknown":
        hint = _suggest(name)
        note = f"not a flag in {lib}: JAX would abort at its first operation"
        note += f"; did you mean --{hint}?" if hint else ""
        return Verdict(token, name, value, "unknown", note, suggestion=hint)
    if entry.get("needs_value"):
        note = (
            f"needs a value: write --{name}=VALUE ({lib} reads a bare --name only for "
            "true/false flags; for any other it aborts: 'Unknown flag in XLA_FLAGS')"
        )
        return Verdict(token, name, "", "bad_value", note)
    if status == "bad_value":
        note = f"{lib} rejects the value {value!r}, JAX would fail to start: {entry['xla']}"
        return Verdict(token, name, value, "bad_value", note)
    effect, per, defaults = entry["effect"], entry["per_compile"], installed_defaults()
    field = REGISTRY[name].field if name in REGISTRY and REGISTRY[name].field else name
    if effect:
        note = "sets " + ", ".join(
            f"{k}={v} (default: {default_text(defaults, k)})" for k, v in effect.items()
        )
    elif "No such compile option" not in per or field != name:
        note = f"no change: {field} is already {default_text(defaults, field)}"
    else:
        note = "accepted, but changes no option: an old name that XLA ignores, or a default"
    if "No such compile option" in per:
        note += "; XLA_FLAGS only, not a compiler_options key"
    elif per:
        note += f"; as a compiler option XLA says: {per}"
    if removed:
        note += "; labkit lists it as removed, yet this jaxlib takes it"
    return Verdict(
        token, name, value, "ok", note, effect=tuple(effect.items()), per_compile=not per
    )


def emit(result: object) -> None:
    """Print ``result`` as the JSON line that :func:`run_with_flags` returns as ``.result``."""
    print(RESULT_MARKER + json.dumps(result), flush=True)


def run_with_flags(
    flags: str | Sequence[str],
    code: str | None = None,
    *,
    module: str | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout_s: float = 600.0,
    cwd: str | None = None,
) -> SubprocessResult:
    """Run a snippet (or ``python -m module args``) in a fresh process with these XLA_FLAGS.

    Flags are validated first: bad ones raise :class:`FlagError` and nothing starts. ``env``
    adds variables; the child's XLA_FLAGS are exactly ``flags``. The snippet returns data by
    printing one ``LABKIT_RESULT <json>`` line, e.g. with ``labkit.xla.flags.emit(...)``.
    """
    if (code is None) == (module is None):
        raise ValueError("give exactly one of code= (a Python snippet) or module= (python -m)")
    verdicts = validate(flags)
    if bad := [v for v in verdicts if v.would_abort]:
        lines = "\n".join(f"  {v.token}: {v.message}" for v in bad)
        raise FlagError(f"{len(bad)} XLA flag(s) would abort JAX; nothing was run:\n{lines}", bad)
    xla_flags = join_flags([v.token for v in verdicts])
    remember_accepted_xla_flags(xla_flags)  # the child's setup() need not check them again
    child_env = {**os.environ, **(env or {}), "XLA_FLAGS": xla_flags}
    cmd = ["-c", code] if code is not None else ["-m", str(module), *args]
    start = time.perf_counter()
    try:
        proc = _spawn([sys.executable, *cmd], child_env, timeout_s, cwd)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr or ""
        tail = err.decode(errors="replace") if isinstance(err, bytes) else err
        raise TimeoutError(
            f"the subprocess did not finish within {timeout_s:g} s (XLA_FLAGS={xla_flags!r}); "
            f"give a larger timeout_s or a smaller experiment. stderr so far:\n{tail[-1500:]}"
        ) from None
    seconds = time.perf_counter() - start
    result = _result_of(proc.stdout)
    return SubprocessResult(proc.returncode, proc.stdout, proc.stderr, result, seconds, xla_flags)


@dataclasses.dataclass(frozen=True)
class FlagCompile:
    """A compile run in a subprocess under ``XLA_FLAGS``: its HLO and numbers."""

    xla_flags: str
    hlo: str
    summary: dict[str, JSON]  # what the child's report_compile emitted
    seconds: float


def run_compile_child(
    flags: str | Sequence[str], module: str, args: Sequence[str], out: Path, timeout_s: float
) -> FlagCompile:
    """Run ``python -m module *args out`` under ``XLA_FLAGS=flags`` (validated first, see
    :func:`run_with_flags`) and read the program its child wrote to ``out`` with
    :func:`report_compile`. A failed child raises with the end of its stderr."""
    run = run_with_flags(flags, module=module, args=[*args, str(out)], timeout_s=timeout_s)
    if run.returncode != 0 or not isinstance(run.result, dict) or not out.exists():
        raise RuntimeError(
            f"the compile under XLA_FLAGS={run.xla_flags!r} failed (exit {run.returncode}):\n"
            f"{run.stderr[-2000:]}"
        )
    return FlagCompile(run.xla_flags, out.read_text(), run.result, run.seconds)


def report_compile(text: str, out: Path) -> None:
    """Child side of :func:`run_compile_child`: write the program to ``out``, emit its summary."""
    from labkit.xla import hlo  # read in the child only: this module stays light to import
    from labkit.xla.compare import pipelined

    out.write_text(text)
    emit({**hlo.summary(text), "pipelined": len(pipelined(text))})


def default_of(name: str) -> str:
    """The installed jaxlib's default of a flag (or of an old name's field), as
    :func:`~labkit.xla.flag_registry.default_text` shows it; "cannot be read" if the probe fails."""
    field = REGISTRY[name].field if name in REGISTRY and REGISTRY[name].field else name
    try:
        return default_text(installed_defaults(), field)
    except ProbeError:
        return "cannot be read"


def describe(name: str) -> str:
    """What a flag does, its installed default and where it is documented."""
    name = parse([name if name.startswith("--") else f"--{name}"])[0][0]
    if name in REMOVED:
        r = REMOVED[name]
        return f"--{name}: removed from XLA\n  instead: {r.replacement}\n  source: {r.source}"
    if name not in REGISTRY:
        if name in installed_defaults():
            value = installed_defaults()[name]
            typed = {name: typed_value(name, value)}
            return (
                f"--{name}: not described by labkit; default {value}\n  per compile: "
                f"jax.jit(f).lower(...).compile(compiler_options={typed!r})\n  source: {X}"
            )
        hint = _suggest(name)
        raise FlagError(f"unknown flag --{name}" + (f"; did you mean --{hint}?" if hint else ""))
    f = REGISTRY[name]
    sets = f" (sets {f.field})" if f.field else ""
    default = default_of(name)
    option = compile_options([f"--{name}={f.example}"])
    alias = f" (--{name} itself is XLA_FLAGS only)" if f.field else ""
    return (
        f"--{name}: {f.kind}{sets}\n  {f.what}\n  default in jaxlib {jaxlib_version()}: "
        f"{default}\n  example: --{name}={f.example}\n  per compile: "
        f"jax.jit(f).lower(...).compile(compiler_options={option!r}){alias}\n"
        f"  source: {f.source}"
    )
