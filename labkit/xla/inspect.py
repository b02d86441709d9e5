"""Your own program on 8 H100s, without an H100: compile any jittable function and read it.

:func:`inspect` takes a function (a train step, a forward pass, a Flax NNX module call) and
example arguments, compiles it for compile-only H100s (:mod:`labkit.xla.aot`: XLA's real GPU
pipeline, run on the CPU) and returns a :class:`~labkit.xla.inspect_report.Report`:
collectives with their overlap estimate, GEMMs, kernels, loops, memory, FLOPs, the kit's model
of the step (a range) and XLA's own estimate beside it (its scheduler's cost model, read from
the compile's schedule dump), and findings with what to try. Nothing runs on a GPU and nothing
is autotuned.

Arguments are arrays, ``jax.ShapeDtypeStruct`` s, or pytrees of them (Flax NNX modules and
optimizers are pytrees). Their shardings say how the program is split:

- a leaf whose ``sharding`` is a ``PartitionSpec`` (``ShapeDtypeStruct(shape, dtype,
  sharding=P("data"))``, no mesh needed) or a ``NamedSharding`` on any mesh (CPU devices, an
  ``AbstractMesh``) keeps its spec, moved onto the H100 mesh;
- any other leaf (a NumPy array, an array on one device) is replicated.

The H100 mesh is ``mesh`` (a ``Mesh``, an ``AbstractMesh``, ``{"data": 4, "model": 2}`` or
``"data=4,model=2"``), else the mesh of the first ``NamedSharding`` among the arguments,
else ``{"data": num_gpus}``. The function is traced inside ``jax.set_mesh`` of that mesh, so
``jax.shard_map`` without a mesh and bare ``PartitionSpec`` s inside it refer to it. The
report's JSON layout is :mod:`labkit.xla.inspect_schema`.

The file convention of ``labkit inspect FILE.py[:NAME]`` (:func:`inspect_file`): the file
defines

- the function, named ``NAME`` (default :data:`DEFAULT_NAME`, ``step``);
- ``NAME_args(mesh)`` or ``example_args(mesh)``: its example positional arguments as a
  tuple; ``mesh`` (the H100 mesh, which the function may ignore or omit) lets it choose
  shardings;
- optionally ``MESH``, the mesh used when none is given (``"data=4,model=2"`` or a dict).

Bind keyword arguments with ``functools.partial``; for donation or static arguments, make
the function ``jax.jit(step, donate_argnums=...)`` in the file.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import inspect as pyinspect
import math
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from labkit.core.types import CompilerOptions, PyTree
from labkit.xla.aot import h100_mesh
from labkit.xla.cost import cost
from labkit.xla.inspect_report import Report, build_report
from labkit.xla.memory import memory
from labkit.xla.xla_estimate import compile_with_estimate

if TYPE_CHECKING:
    from jax.sharding import AbstractMesh, Mesh, PartitionSpec
    from jax.stages import Lowered

__all__ = [
    "COMPILE_CHECK",
    "DEFAULT_NAME",
    "TARGETS",
    "TRACE_CHECK",
    "CompileError",
    "MeshLike",
    "ProgramFileError",
    "inspect",
    "inspect_file",
    "load_program",
    "mesh_axes",
    "place",
    "split_spec",
    "target_mesh",
]

TARGETS = {"h100": "H100 SXM"}  # target -> hardware table entry the deviceless devices are
DEFAULT_NAME = "step"
COMPILE_CHECK = (
    "that each flag exists in this jaxlib (`labkit flags check --xla_...`) and takes that "
    "value, and that the function compiles for the CPU: jax.jit(fn).lower(*args).compile()"
)
TRACE_CHECK = (
    "that the example arguments match the function's parameters, that every sharded "
    "dimension divides by its mesh axis (another mesh: --mesh, mesh=), and that the function "
    "runs on the CPU: jax.jit(fn)(*args)"
)


type MeshLike = Mesh | AbstractMesh | Mapping[str, int] | str
"""A mesh as :func:`mesh_axes` reads it: ``Mesh``, ``AbstractMesh``, ``{"data": 4, "model": 2}``
or ``"data=4,model=2"``."""


class CompileError(RuntimeError):
    """XLA could not compile the program for the target; the message is XLA's, shortened."""


class ProgramFileError(ValueError):
    """A file given to :func:`inspect_file` does not follow the file convention."""


class MeshError(ValueError):
    """A mesh the inspection cannot model: a repeated axis, a bad size, more GPUs than a host."""


# An HGX H100 host: 8 GPUs, NVLink between all of them. The overlap and step models price every
# collective on NVLink; a mesh larger than one host would need the inter-host network's figures.
GPUS_PER_HOST = 8


def _gpu(target: str) -> str:
    key = target.lower().removesuffix(" sxm").strip()
    if key not in TARGETS:
        raise ValueError(f"unknown target {target!r}; choose one of {sorted(TARGETS)}")
    return TARGETS[key]


def mesh_axes(mesh: MeshLike) -> dict[str, int]:
    """Axis name -> size of a ``Mesh``, ``AbstractMesh``, mapping or ``"data=4,model=2"``."""
    if isinstance(mesh, str):
        axes = {}
        for part in filter(None, (p.strip() for p in mesh.split(","))):
            m = re.fullmatch(r"([A-Za-z_]\w*)\s*=\s*(\d+)", part)
            if m is None:
                raise ValueError(
                    f"a mesh is NAME=SIZE pairs separated by commas, e.g. data=4,model=2; "
                    f"got {mesh!r}"
                )
            if m.group(1) in axes:
                raise MeshError(
                    f"mesh axis {m.group(1)!r} is given twice in {mesh!r}: give each axis "
                    "once (a second axis needs a name of its own, e.g. data=4,model=2)"
                )
            axes[m.group(1)] = int(m.group(2))
        mesh = axes
    elif hasattr(mesh, "axis_names") and hasattr(mesh, "axis_sizes"):
        mesh = dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))
    if not isinstance(mesh, Mapping) or not mesh:
        raise ValueError(
            f"give a mesh as a jax Mesh, a dict such as {{'data': 8}} or 'data=4,model=2'; "
            f"got {mesh!r}"
        )
    out = {str(k): v for k, v in mesh.items()}
    if any(not isinstance(v, int) or v < 1 for v in out.values()):
        raise ValueError(f"mesh axis sizes must be positive integers, got {out}")
    return out


def _on_h100(mesh: Mesh) -> bool:
    devices = getattr(mesh, "devices", None)
    flat = getattr(devices, "flat", None)
    return flat is not None and all("H100" in d.device_kind for d in flat)


def _mesh_in(tree: PyTree) -> Mesh | AbstractMesh | None:
    import jax
    from jax.sharding import NamedSharding

    for leaf in jax.tree.leaves(tree):
        try:
            sharding = getattr(leaf, "sharding", None)
        except TypeError:  # a ShapeDtypeStruct with a bare PartitionSpec outside a mesh
            continue
        if isinstance(sharding, NamedSharding):
            return sharding.mesh
    return None


def target_mesh(mesh: MeshLike | None, args: PyTree = (), num_gpus: int = 8) -> Mesh:
    """The compile-only H100 mesh a program compiles for (see the module docstring)."""
    from jax.sharding import AxisType, Mesh

    found = mesh if mesh is not None else _mesh_in(args)
    if isinstance(found, Mesh) and _on_h100(found):
        return found
    axes = mesh_axes(found) if found is not None else {"data": num_gpus}
    if (total := math.prod(axes.values())) > GPUS_PER_HOST:
        shown = ",".join(f"{k}={v}" for k, v in axes.items())
        raise MeshError(
            f"mesh {shown} needs {total} GPUs; an HGX host has {GPUS_PER_HOST}, with NVLink "
            f"between them, and the inspection models one host (its collectives on NVLink). "
            f"Give a mesh of at most {GPUS_PER_HOST} GPUs (e.g. data=2,model=4); for more hosts "
            "compile with labkit.xla.aot.h100_mesh(shape, names, num_hosts=...) yourself"
        )
    types = tuple(getattr(found, "axis_types", ()) or ())
    explicit = bool(types) and all(t == AxisType.Explicit for t in types)
    return h100_mesh(tuple(axes.values()), tuple(axes), explicit=explicit)


def _spec_axes(spec: PartitionSpec) -> list[str]:
    out: list[str] = []
    for entry in spec:
        if isinstance(entry, str):
            out.append(entry)
        elif isinstance(entry, tuple):
            out += [a for a in entry if isinstance(a, str)]
    return out


def place(tree: PyTree, mesh: Mesh) -> PyTree:
    """``tree`` with every array leaf a ``ShapeDtypeStruct`` on ``mesh`` (specs kept, see the
    module docstring); leaves without shape and dtype (Python numbers) stay as they are."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    fix = "pass a mesh with that axis (mesh='data=4,model=2', --mesh) or change the spec"

    def one(x: object) -> object:
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            return x
        try:
            sharding = getattr(x, "sharding", None)
        except ValueError as exc:  # a bare PartitionSpec naming an axis this mesh lacks
            raise ValueError(f"an argument of shape {tuple(x.shape)}: {exc} {fix}") from None
        if isinstance(sharding, NamedSharding):
            spec = sharding.spec
        else:
            spec = sharding if isinstance(sharding, PartitionSpec) else PartitionSpec()
        missing = [a for a in _spec_axes(spec) if a not in mesh.axis_names]
        if missing:
            raise ValueError(
                f"an argument of shape {tuple(x.shape)} is sharded {spec}, but the mesh "
                f"{mesh_axes(mesh)} has no axis {', '.join(map(repr, missing))}: {fix}"
            )
        return jax.ShapeDtypeStruct(
            x.shape,
            x.dtype,
            sharding=NamedSharding(mesh, spec),
            weak_type=bool(getattr(x, "weak_type", False)),
        )

    with jax.set_mesh(mesh):  # a bare PartitionSpec on a ShapeDtypeStruct reads this mesh
        return jax.tree.map(one, tree)


class _WithKeywords:
    """``fn`` jitted, with keyword arguments bound at lowering (they are traced, not constant)."""

    def __init__(self, fn: Callable[..., object], kwargs: Mapping[str, PyTree]) -> None:
        import jax

        self.jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
        self.kwargs = dict(kwargs)

    def lower(self, *args: PyTree) -> Lowered:
        """``jitted.lower(*args, **kwargs)``."""
        return self.jitted.lower(*args, **self.kwargs)

    def __call__(self, *args: PyTree) -> PyTree:
        return self.jitted(*args, **self.kwargs)


def _short(error: BaseException, lines: int = 8) -> str:
    text = [line for line in str(error).splitlines() if line.strip()]
    more = f"\n... ({len(text) - lines} more lines)" if len(text) > lines else ""
    return "\n".join(text[:lines]) + more


def _name(fn: object) -> str:
    inner = getattr(fn, "func", fn)  # functools.partial
    return str(getattr(inner, "__name__", type(inner).__name__))


def inspect(
    fn: Callable[..., object],
    *args: PyTree,
    mesh: MeshLike | None = None,
    target: str = "h100",
    num_gpus: int = 8,
    compiler_options: CompilerOptions | None = None,
    same_program_options: CompilerOptions | None = None,
    **kwargs: PyTree,
) -> Report:
    """Compile ``fn(*args, **kwargs)`` for ``target`` GPUs without a GPU and report on it.

    ``compiler_options`` are the XLA flags to try (per-compile options: an unknown name raises
    :class:`CompileError`, it cannot kill the process); the report lists them.
    ``same_program_options`` are options that leave the program byte for byte the same and
    only make the compile cheaper (``labkit.gpt.compile.same_program_options()``); the report
    leaves them out. ``num_gpus`` sizes the default mesh only. See the module docstring for
    meshes and shardings.
    """
    import jax

    gpu = _gpu(target)
    h100 = target_mesh(mesh, (args, kwargs), num_gpus)
    placed, keywords = place((args, kwargs), h100)
    if not any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(placed)):
        raise ValueError(
            "inspect needs at least one array (or jax.ShapeDtypeStruct) among the positional "
            "arguments: that is what places the program on the GPUs"
        )
    call = _WithKeywords(fn, keywords) if keywords else fn
    options = {**dict(same_program_options or {}), **dict(compiler_options or {})}
    try:
        with jax.set_mesh(h100):  # shard_map and bare PartitionSpecs in fn read this mesh
            result, estimate = compile_with_estimate(call, *placed, compiler_options=options)
    except jax.errors.JaxRuntimeError as exc:
        raise CompileError(
            f"XLA could not compile {_name(fn)} for {h100.size} x {gpu}:\n{_short(exc)}\n"
            f"What to check: {COMPILE_CHECK}"
        ) from exc
    except RuntimeError as exc:
        if "Unknown backend: 'gpu' requested" not in str(exc):
            raise
        raise CompileError(  # a host callback lowers against the GPU backend, absent here
            f"{_name(fn)} calls back into Python on the host (jax.pure_callback, io_callback, "
            "jax.debug.print or a callback of jax.debug): a host callback cannot be compiled "
            f"for a GPU without one ({gpu} here is a compile-only target). Leave it out of "
            "the function you inspect, or compile on a machine with a GPU"
        ) from exc
    return build_report(
        result.hlo,
        name=_name(fn),
        gpu=gpu,
        mesh=mesh_axes(h100),
        compiler_options=compiler_options,
        memory=memory(result.compiled),
        xla_flops=cost(result.compiled).get("flops"),
        jax_version=jax.__version__,
        xla=estimate,
        tiles=result.tiles,
    )


# ---------------------------------------------------------------------------------------
# The file convention (labkit inspect FILE.py[:NAME])


def split_spec(spec: str | Path) -> tuple[Path, str]:
    """``"model.py:train_step"`` -> ``(Path("model.py"), "train_step")``; NAME defaults to
    :data:`DEFAULT_NAME`."""
    text = str(spec)
    m = re.fullmatch(r"(.+\.py):([A-Za-z_]\w*)", text)
    path, name = (m.group(1), m.group(2)) if m else (text, DEFAULT_NAME)
    if not path.endswith(".py"):
        raise ProgramFileError(f"expected FILE.py or FILE.py:NAME, got {text!r}")
    return Path(path), name


@functools.lru_cache(maxsize=32)
def _load(path: str, mtime_ns: int, size: int) -> ModuleType:
    """Import ``path`` once per version of the file (so its functions keep their identity)."""
    del mtime_ns, size  # part of the cache key only
    name = "labkit_program_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ProgramFileError(f"{path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling in the file look themselves up
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def load_program(path: str | Path) -> ModuleType:
    """Import a program file (cached while the file is unchanged); errors raised by its own
    code pass through unchanged."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ProgramFileError(f"no such file: {path}")
    if file.suffix != ".py":
        raise ProgramFileError(f"{path} is not a Python file (FILE.py)")
    stat = file.stat()
    return _load(str(file), stat.st_mtime_ns, stat.st_size)


def _functions(module: ModuleType) -> list[str]:
    return sorted(
        k
        for k, v in vars(module).items()
        if callable(v) and not k.startswith("_") and getattr(v, "__module__", "") == module.__name__
    )


def _example_args(module: ModuleType, path: Path, name: str, mesh: Mesh) -> tuple[PyTree, ...]:
    maker = getattr(module, f"{name}_args", None) or getattr(module, "example_args", None)
    if not callable(maker):
        raise ProgramFileError(
            f"{path} defines no example arguments for {name}: add `def example_args(mesh):` "
            f"(or `def {name}_args(mesh):`) returning a tuple of {name}'s positional arguments "
            "(arrays or jax.ShapeDtypeStructs, sharded with PartitionSpecs where you want)"
        )
    takes_mesh = bool(pyinspect.signature(maker).parameters)
    args = maker(mesh) if takes_mesh else maker()
    if not isinstance(args, tuple):
        raise ProgramFileError(
            f"{path}: {maker.__name__}() returned {type(args).__name__}; return a tuple of "
            f"{name}'s positional arguments, e.g. `return (params, batch)` or `return (x,)`"
        )
    return args


def inspect_file(
    spec: str | Path,
    mesh: MeshLike | None = None,
    compiler_options: CompilerOptions | None = None,
    same_program_options: CompilerOptions | None = None,
    target: str = "h100",
    num_gpus: int = 8,
) -> Report:
    """:func:`inspect` on the function and example arguments of ``FILE.py[:NAME]`` (see the
    module docstring); ``mesh`` overrides the file's ``MESH``."""
    path, name = split_spec(spec)
    module = load_program(path)
    fn = getattr(module, name, None)
    if not callable(fn):
        found = ", ".join(_functions(module)) or "none"
        raise ProgramFileError(
            f"{path} defines no function {name!r} (functions defined there: {found}); name "
            f"one with {path.name}:NAME"
        )
    chosen = mesh if mesh is not None else getattr(module, "MESH", None)
    try:
        h100 = target_mesh(chosen if chosen is not None else {"data": num_gpus})
    except ValueError as exc:
        if mesh is not None or chosen is None:
            raise
        raise ProgramFileError(
            f"{path} sets MESH = {chosen!r}, which is not usable: {exc}"
        ) from None
    args = _example_args(module, path, name, h100)
    report = inspect(
        fn,
        *args,
        mesh=h100,
        target=target,
        compiler_options=compiler_options,
        same_program_options=same_program_options,
    )
    return _renamed(report, f"{path.name}:{name}")


def _renamed(report: Report, name: str) -> Report:
    return dataclasses.replace(report, program=dataclasses.replace(report.program, name=name))
