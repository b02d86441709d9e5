"""01b_pjrt_plugins: a third-party PJRT plugin in JAX, a wrapping plugin, the C API by hand.

Here: the fresh process that runs the kit's GPT step on JAX's built-in CPU backend and on a
PJRT plugin registered under a name of its own (``JAX_PLATFORMS=cpu`` in the notebook's
process keeps plugins out, so this runs apart), the table of what each layer owns, and the
exercise checkers.

Run as ``python -m labkit.lessons.n01b_pjrt_plugins STEPS BUILTIN NAME=LIBRARY...``, it is
that fresh process: it prints one JSON line with each backend's losses and timings.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from labkit.core.feedback import Feedback, check_integer, judge, unanswered
from labkit.core.types import PyTree

if TYPE_CHECKING:  # the child imports jax only once JAX_PLATFORMS names its plugins
    import jax
    import numpy as np
    from jax.typing import ArrayLike

    from labkit.gpt.train import State
    from labkit.runtime.pjrt import ApiVersion
    from labkit.runtime.pjrt_wrapper import Log

PRESET = "tiny"  # the GPT preset the fresh process trains
BATCH = 8  # its batch (one device per backend)
PLUGIN_MODULE = "fastatomstruct_xla_cpu"  # the third-party plugin's Python package
PLUGIN_DIST = "fastatomstruct-xla-cpu"  # and its distribution (pinned in pyproject.toml)
ONE_DEVICE = {"cpu_device_count": 1}  # PJRT_Client_Create options of the CPU plugin


class BackendRun(TypedDict):
    """The GPT step on one backend, as the fresh process reports it."""

    losses: list[float]  # one per step
    compile_s: float
    step_ms: float  # the median step
    platform: str
    platform_version: str
    devices: int
    state_arrays: int  # arrays in the train state
    c_api: str  # the plugin's PJRT C API version, or "built in"


def run_step_on_plugins(
    plugins: Mapping[str, str | Path],
    steps: int = 3,
    env: Mapping[str, str] | None = None,
    builtin: bool = True,
    timeout_s: float = 300,
) -> dict[str, BackendRun | float]:
    """Train ``steps`` GPT steps on the built-in CPU backend and on each plugin, in a child.

    A fresh process registers each library of ``plugins`` (``{name: library}``) as a JAX
    platform before any backend starts (``JAX_PLATFORMS=cpu,<names>``); ``env`` adds
    variables (a wrapper's). The state is initialized once on the built-in CPU backend and
    copied to each plugin. Returns ``{backend: {...}}`` for ``"cpu"`` (unless ``builtin`` is
    False) and every plugin:
    losses, compile and step times, platform, C API version, and ``wall_s`` for the child.
    """
    pairs = [f"{name}={library}" for name, library in plugins.items()]
    command = [sys.executable, "-m", __name__, str(steps), str(int(builtin)), *pairs]
    variables = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    variables.pop("JAX_PLATFORMS", None)
    start = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=variables)
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines:
        raise RuntimeError(
            f"the plugin process failed (exit {run.returncode}):\n{run.stderr[-2000:]}"
        )
    result: dict[str, BackendRun | float] = json.loads(lines[-1])
    result["wall_s"] = time.perf_counter() - start
    return result


def _train(backend: str, steps: int, host_state: PyTree) -> BackendRun:
    """Compile the GPT step for one device of ``backend`` and run ``steps`` steps."""
    import jax
    import numpy as np
    from jax._src import xla_bridge

    from labkit.gpt.compile import local_train_step

    def place(abstract: State) -> State:  # the same initial state on every backend
        return jax.tree.map(lambda h, a: jax.device_put(h, a.sharding), host_state, abstract)

    start = time.perf_counter()
    devices = jax.devices(backend)[:1]
    compiled, state, batch = local_train_step(
        PRESET, "dp", BATCH, devices=devices, make_state=place
    )
    compile_s = time.perf_counter() - start
    losses, times = [], []
    for _ in range(steps):
        start = time.perf_counter()
        state, loss = compiled(state, batch)
        losses.append(float(loss))
        times.append(time.perf_counter() - start)
    client = xla_bridge.get_backend(backend)
    api = xla_bridge.backend_pjrt_c_api_version(backend)
    return {
        "losses": losses,
        "compile_s": compile_s,
        "step_ms": float(np.median(times)) * 1e3,
        "platform": client.platform,
        "platform_version": client.platform_version,
        "devices": client.device_count(),
        "state_arrays": len(jax.tree.leaves(state)),
        "c_api": f"{api[0]}.{api[1]}" if api and api != (0, 0) else "built in",
    }


def _initial_state() -> PyTree:
    """The GPT's initial train state on the built-in CPU backend, as NumPy arrays."""
    import jax
    import numpy as np

    from labkit.core.mesh import make_mesh
    from labkit.gpt import train
    from labkit.gpt.config import GPTConfig

    cfg = GPTConfig.preset(PRESET)
    mesh = make_mesh((1,), ("data",), devices=jax.devices("cpu")[:1])
    _, abstract, _ = train.train_setup(cfg, mesh, "dp", BATCH)
    return jax.tree.map(np.asarray, train.init_train_state(cfg, abstract))


def _child(argv: Sequence[str]) -> int:
    """Child side of :func:`run_step_on_plugins`: ``STEPS BUILTIN NAME=LIBRARY...``."""
    steps, builtin = int(argv[0]), bool(int(argv[1]))
    plugins = dict(pair.split("=", 1) for pair in argv[2:])
    os.environ["JAX_PLATFORMS"] = ",".join(["cpu", *plugins])
    from jax._src import xla_bridge

    for name, library in plugins.items():
        xla_bridge.register_plugin(name, library_path=library, options=ONE_DEVICE)
    import jax

    jax.config.update("jax_num_cpu_devices", 1)
    host_state = _initial_state()
    backends = ["cpu", *plugins] if builtin else list(plugins)
    print(json.dumps({b: _train(b, steps, host_state) for b in backends}))
    return 0


# --------------------------------------------------------------------------------------
# A jax.export module for the hand-driven client


def mlp(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    """A two-layer MLP: ``tanh(x @ w1) @ w2``; (batch, d_in) -> (batch, d_out)."""
    import jax.numpy as jnp

    return jnp.tanh(x @ w1) @ w2  # (batch, d_out)


def mlp_inputs(
    batch: int = 64, d_in: int = 256, hidden: int = 512, d_out: int = 16
) -> list[np.ndarray]:
    """Fixed random float32 inputs of :func:`mlp`: ``[x, w1, w2]`` as NumPy arrays."""
    import numpy as np

    rng = np.random.default_rng(0)
    shapes = [(batch, d_in), (d_in, hidden), (hidden, d_out)]
    return [(rng.normal(size=s) / np.sqrt(s[0])).astype(np.float32) for s in shapes]


def export_mlp(
    platforms: Sequence[str] = ("cpu",),
) -> tuple[jax.export.Exported, list[np.ndarray]]:
    """``jax.export`` of :func:`mlp` for ``platforms``, and its inputs."""
    import jax

    inputs = mlp_inputs()
    return jax.export.export(jax.jit(mlp), platforms=tuple(platforms))(*inputs), inputs


def export_target_version() -> tuple[int, int, int]:
    """The StableHLO version ``jax.export`` serializes for: the newest one at least four weeks
    old (``_module_to_bytecode`` in ``jax/_src/export/_export.py`` asks for
    ``StablehloCompatibilityRequirement.WEEK_4``), whatever plugin will read it."""
    from jax._src.lib.mlir.dialects import hlo  # the module jax.export calls

    week_4 = hlo.StablehloCompatibilityRequirement.WEEK_4
    major, minor, patch = map(
        int, hlo.get_version_from_compatibility_requirement(week_4).split(".")
    )
    return major, minor, patch


# --------------------------------------------------------------------------------------
# What each layer owns


class ArtifactFacts(TypedDict):
    """The StableHLO module the framework handed over, as :func:`layer_rows` shows it."""

    ops: int
    bytes: int
    version: tuple[int, ...] | None  # the StableHLO version it was written for (None: unknown)


class PluginFacts(TypedDict):
    """The plugin, as :func:`layer_rows` shows it."""

    name: str
    c_api: ApiVersion | str | None  # the plugin's PJRT C API version (None: not logged)
    framework_c_api: ApiVersion | str  # jaxlib's
    devices: int


def layer_rows(
    artifact: ArtifactFacts,
    calls: Mapping[str, int],
    plugin: PluginFacts,
    compile_ms: float,
    step: Mapping[str, float],
) -> list[dict[str, str]]:
    """One row per layer: what it owns, and what this notebook measured of it.

    ``artifact``: ``ops``, ``bytes``, ``version`` of the module the framework handed over;
    ``calls``: C API calls the wrapper counted; ``plugin``: ``name``, ``c_api``,
    ``framework_c_api``, ``devices``; ``compile_ms``: ``PJRT_Client_Compile`` of the MLP
    (hand-driven client); ``step``: ``compile_s`` and ``step_ms`` of the train step on the
    plugin.
    """
    version = ".".join(map(str, artifact["version"])) if artifact["version"] else "?"
    counted = ", ".join(f"{n} {name.removeprefix('PJRT_')}" for name, n in calls.items())
    return [
        {
            "layer": "framework (JAX + jaxlib)",
            "owns": "tracing, autodiff, optimizer, lowering to StableHLO, the training loop",
            "measured here": f"the step as one StableHLO module: {artifact['ops']} ops, "
            f"{artifact['bytes'] / 1e3:.0f} kB, written for StableHLO {version}",
        },
        {
            "layer": "PJRT C API",
            "owns": "a versioned table of C functions and structs: the only contract",
            "measured here": f"{counted}; plugin C API {plugin['c_api']}, "
            f"jaxlib {plugin['framework_c_api']}",
        },
        {
            "layer": f"plugin ({plugin['name']})",
            "owns": "client, devices, memory, buffers, executables, running them",
            "measured here": f"{plugin['devices']} device; a train step {step['step_ms']:.0f} ms",
        },
        {
            "layer": "compiler (XLA inside the plugin)",
            "owns": "optimizing and generating code for its device",
            "measured here": f"the train step compiled in {step['compile_s']:.1f} s, "
            f"the MLP in {compile_ms:.0f} ms (PJRT_Client_Compile)",
        },
    ]


# --------------------------------------------------------------------------------------
# Exercise checkers


def check_executes(answer: object, log: Log) -> Feedback:
    """01b.1: how many times the first executable compiled through the wrapper ran."""
    expected = log.executes[log.compiled[0]] if log.compiled else 0
    return check_integer(
        "01b.1",
        answer,
        expected,
        f"{expected}: one compile, then one execute per step.",
        "count the PJRT_LoadedExecutable_Execute lines naming log.compiled[0] (log.executes)",
    )


def check_max_error(answer: Any, ours: ArrayLike, reference: ArrayLike) -> Feedback:
    """01b.2: the largest |difference| between the C API client's output and JAX's."""
    import numpy as np

    if unanswered(answer):
        return judge("01b.2", answer, False, "", "")
    expected = float(np.max(np.abs(np.asarray(ours, np.float64) - np.asarray(reference))))
    try:
        passed = math.isclose(float(answer), expected, rel_tol=1e-6, abs_tol=1e-12)
    except (TypeError, ValueError):
        return Feedback("01b.2", False, True, f"expected a number, got {type(answer).__name__}")
    return judge(
        "01b.2",
        answer,
        passed,
        f"{expected:.3g}: the same XLA:CPU program, read back through the C API.",
        "np.max(np.abs(ours - reference)), in float64",
    )


def check_compile_calls(answer: object, log_file: str | Path) -> Feedback:
    """01b.p1 (predict): ``PJRT_Client_Compile`` calls the wrapper logged for the steps."""
    from labkit.runtime.pjrt_wrapper import read_log

    expected = read_log(log_file).calls["PJRT_Client_Compile"] if Path(log_file).exists() else 0
    if not expected and not unanswered(answer):
        return Feedback(
            "01b.p1", False, True, "no wrapper log here (no C++ compiler): nothing to check"
        )
    return check_integer(
        "01b.p1",
        answer,
        expected,
        f"{expected}: jit compiles the step once, then only executes it.",
        "not what the wrapper saw: the next cell prints every call it logged",
    )


def gelu_mlp(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    """:func:`mlp` with a GELU: ``gelu(x @ w1) @ w2``; (batch, d_in) -> (batch, d_out)."""
    import jax

    return jax.nn.gelu(x @ w1) @ w2  # (batch, d_out)


def check_gelu_export(answer: object, library: str | Path) -> Feedback:
    """01b.3: a CPU ``jax.export`` of :func:`gelu_mlp` at :func:`mlp_inputs`' shapes, run by
    the hand-driven C API client on the plugin ``library`` and compared with JAX."""
    import jax
    import numpy as np

    from labkit.runtime import pjrt_capi

    if unanswered(answer):
        return judge("01b.3", answer, False, "", "")
    if not isinstance(answer, jax.export.Exported) or "cpu" not in answer.platforms:
        return Feedback("01b.3", False, True, "give jax.export.export(...)(*inputs), for 'cpu'")
    inputs = mlp_inputs()
    try:
        ran = pjrt_capi.run_in_fresh_process(
            "run", library, answer.mlir_module_serialized, inputs, ONE_DEVICE
        )
    except RuntimeError as exc:  # the child says what the plugin refused
        return Feedback("01b.3", False, True, f"the plugin refused it: {exc}"[:300])
    outputs = ran["outputs"]
    assert isinstance(outputs, list)
    reference = np.asarray(gelu_mlp(*map(jax.numpy.asarray, inputs)), np.float64)
    error = float(np.max(np.abs(np.asarray(outputs[0], np.float64) - reference)))
    return judge(
        "01b.3",
        answer,
        error < 1e-4,
        f"the plugin, driven by hand, computes gelu(x @ w1) @ w2 (largest difference {error:.1e}).",
        f"the plugin's output differs from gelu(x @ w1) @ w2 by up to {error:.2g}: "
        "export the GELU MLP, with the lesson's inputs",
    )


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit("usage: python -m labkit.lessons.n01b_pjrt_plugins STEPS 0|1 NAME=LIBRARY...")
    sys.exit(_child(sys.argv[1:]))
