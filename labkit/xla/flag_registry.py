"""The XLA flags a GPU lab needs: registry, removed names, and how to write them.

What each flag does and where it is documented (:data:`REGISTRY`), which once-recommended
flags are gone and what replaced them (:data:`REMOVED`), the 2023 recommendations, and the
parsing and typing of ``--name=value`` tokens for ``XLA_FLAGS`` or ``compiler_options``.
Checking flags against the installed jaxlib is :mod:`labkit.xla.flags`.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

from labkit.core.types import CompilerOption

Status = Literal["ok", "unknown", "removed", "bad_value"]
Kind = Literal["bool", "int", "str", "enum", "enum-list"]
RESULT_MARKER = "LABKIT_RESULT "
UNSET = "not set"  # the defaults leave this field out; typed fields show what XLA reads then
_ZERO = {"bool": "false", "int": "0", "str": '""', "enum-list": "empty list"}
X = "openxla/xla: xla/debug_options_flags.cc, xla/xla.proto (DebugOptions)"
T = "; JAX GPU performance tips: https://docs.jax.dev/en/latest/gpu_performance_tips.html"
T23 = "; JAX GPU performance tips as of jaxlib 0.4.18 (Oct 2023): docs/gpu_performance_tips.md"
NV = "; NVIDIA JAX-Toolbox: docs.nvidia.com/jax-toolbox/performance-profiling/gpu-performance"
PAX = "; NVIDIA JAX-Toolbox (2023): rosetta/rosetta/projects/pax/README.md, XLA Flags"
GONE = "; xla/xla.proto lists it among DebugOptions' reserved (deleted) names"


class Judged(Protocol):
    """What :class:`FlagError` holds per bad token: a :class:`labkit.xla.flags.Verdict`."""

    @property
    def token(self) -> str: ...
    @property
    def status(self) -> Status: ...
    @property
    def message(self) -> str: ...


class FlagError(ValueError):
    """Flags that would abort JAX; ``verdicts`` says which and why."""

    def __init__(self, message: str, verdicts: Sequence[Judged] = ()) -> None:
        super().__init__(message)
        self.verdicts = tuple(verdicts)


@dataclasses.dataclass(frozen=True)
class Flag:
    """An XLA flag: its type, an example value, where it is documented, what it does."""

    name: str
    kind: Kind
    example: str
    source: str
    what: str
    field: str = ""  # the DebugOptions field an old name sets, when not its own name
    prefix: str = ""  # compiler_options want enum values with this prefix; XLA_FLAGS not


@dataclasses.dataclass(frozen=True)
class Removed:
    """A flag of older guides that this jaxlib rejects, and what to use instead."""

    name: str
    replacement: str
    source: str


# fmt: off
_P = "COLLECTIVE_PIPELINING_MODE_"
REGISTRY: dict[str, Flag] = {n: Flag(n, *rest) for n, *rest in (  # type: ignore[arg-type]
    ("xla_gpu_all_reduce_combine_threshold_bytes", "int", "0", X + T,
     "Merges independent all-reduces until the result holds this many bytes; 0: never."),
    ("xla_gpu_all_gather_combine_threshold_bytes", "int", "0", X + T,
     "The same for all-gathers (FSDP's weight gathers)."),
    ("xla_gpu_reduce_scatter_combine_threshold_bytes", "int", "0", X + T,
     "The same for reduce-scatters (FSDP's gradient reductions)."),
    ("xla_gpu_enable_latency_hiding_scheduler", "bool", "true", X + T + NV,
     "Starts async collectives early and ends them late so compute runs in between."),
    ("xla_gpu_enable_highest_priority_async_stream", "bool", "true", X + T23,
     "Launches collectives on a highest-priority CUDA stream, ahead of compute kernels."),
    ("xla_gpu_enable_pipelined_all_gather", "bool", "true", X + PAX,
     "Old name: true sets xla_gpu_pipeline_all_gather=ON.", "xla_gpu_pipeline_all_gather"),
    ("xla_gpu_enable_pipelined_reduce_scatter", "bool", "true", X + PAX,
     "Old name: true sets xla_gpu_pipeline_reduce_scatter=ON.", "xla_gpu_pipeline_reduce_scatter"),
    ("xla_gpu_enable_pipelined_all_reduce", "bool", "true", X + PAX,
     "Old name: true sets xla_gpu_pipeline_all_reduce=ON.", "xla_gpu_pipeline_all_reduce"),
    ("xla_gpu_pipeline_all_gather", "enum", "ON", X, "Moves all-gathers of a loop's next "
     "iteration into this one: DEFAULT, OFF, ON or EXPLICIT.", "", _P),
    ("xla_gpu_pipeline_reduce_scatter", "enum", "OFF", X,
     "The same for reduce-scatters (into the next iteration).", "", _P),
    ("xla_gpu_pipeline_all_reduce", "enum", "ON", X,
     "The same for all-reduces (into the next iteration).", "", _P),
    ("xla_gpu_collective_permute_decomposer_threshold", "int", "1024", X + T23,
     "Collective-permutes this large become send/recv pairs that compute can overlap."),
    ("xla_gpu_disable_async_collectives", "enum-list", "ALLREDUCE", X,
     "Collective types to run synchronously (ALLREDUCE, ALLGATHER, REDUCESCATTER, ...)."),
    ("xla_gpu_enable_triton_gemm", "bool", "false", X + NV,
     "Lets XLA emit matmuls as Triton fusions; false sends them to cuBLAS / cuBLASLt."),
    ("xla_gpu_triton_gemm_any", "bool", "true", X + T,
     "Uses Triton for every matmul it supports, not only where XLA expects a win."),
    ("xla_gpu_experimental_use_collective_kernels", "enum-list", "", X, "Collectives XLA may "
     "run as its own Triton kernels, not NCCL (the default lists ALL_REDUCE); empty: none.",
     "", "COLLECTIVE_KERNEL_"),
    ("xla_gpu_enable_analytical_latency_estimator", "bool", "true", X + NV,
     "Gives the latency hiding scheduler an analytical cost model of collectives."),
    ("xla_gpu_enable_command_buffer", "enum-list", "", X + T,
     "Op types recorded into CUDA graphs (FUSION, CUBLAS, ...); empty turns graphs off."),
    ("xla_allow_excess_precision", "bool", "true", X,
     "Lets XLA drop rounding steps such as f32 -> bf16 -> f32 pairs."),
    ("xla_dump_to", "str", "/tmp/xla_dump", X, "Directory for XLA's dumps."),
    ("xla_dump_hlo_as_text", "bool", "true", X, "Dumps HLO before and after optimization."),
    ("xla_dump_hlo_pass_re", "str", ".*", X, "Also dumps HLO after passes matching this regex."),
)}
_ASYNC = "async is the default; to make it synchronous: --xla_gpu_disable_async_collectives="
_ON = "nothing to set: {} is always on now"
REMOVED: dict[str, Removed] = {n: Removed(n, *rest) for n, *rest in (
    ("xla_gpu_enable_triton_softmax_fusion", "nothing to set: XLA:GPU fuses softmax into "
     "Triton fusions by itself", X + T23 + GONE),
    ("xla_gpu_enable_async_collectives", _ASYNC + "ALLREDUCE,ALLGATHER,...", X + T23 + GONE),
    ("xla_gpu_enable_pipelined_collectives", "per collective: --xla_gpu_pipeline_all_gather"
     "=ON (also _reduce_scatter, _all_reduce)", X + T23 + GONE),
    ("xla_gpu_enable_async_all_reduce", _ASYNC + "ALLREDUCE", X + PAX + GONE),
    ("xla_gpu_enable_async_all_gather", _ASYNC + "ALLGATHER", X + PAX + GONE),
    ("xla_gpu_enable_async_reduce_scatter", _ASYNC + "REDUCESCATTER", X + PAX + GONE),
    ("xla_gpu_enable_async_collective_permute", _ASYNC + "COLLECTIVEPERMUTE", X + GONE),
    ("xla_gpu_enable_async_all_to_all", _ASYNC + "ALLTOALL", X + GONE),
    ("xla_gpu_simplify_all_fp_conversions", "--xla_allow_excess_precision", X + PAX + GONE),
    ("xla_gpu_graph_level", "--xla_gpu_enable_command_buffer= (no CUDA graphs)", X + PAX + GONE),
    ("xla_gpu_enable_xla_runtime_executable", _ON.format("the thunk runtime"), X + PAX + GONE),
    ("xla_gpu_enable_triton_hopper", _ON.format("Triton on Hopper"), X + GONE),
    ("xla_gpu_enable_priority_fusion", _ON.format("priority fusion"), X + GONE),
)}
# fmt: on
# The XLA_FLAGS example of the JAX GPU performance tips page as of jaxlib 0.4.18 (Oct 2023).
RECOMMENDED_2023: tuple[str, ...] = (
    "--xla_gpu_enable_triton_softmax_fusion=true",
    "--xla_gpu_triton_gemm_any=True",
    "--xla_gpu_enable_async_collectives=true",
    "--xla_gpu_enable_latency_hiding_scheduler=true",
    "--xla_gpu_enable_highest_priority_async_stream=true",
)
RECOMMENDED_2023_SOURCE = T23[2:]


def default_text(defaults: Mapping[str, str], field: str) -> str:
    """A DebugOptions field's installed default as shown to learners: its value ("empty list"
    for an empty one) or, for a field the defaults leave out, what XLA reads then: the proto
    zero value of its kind, marked "(not set)" (a pass may still decide by itself, as the
    latency-hiding scheduler does by optimization effort)."""
    if field in defaults:
        return defaults[field] or "empty list"
    kind = next((f.kind for f in REGISTRY.values() if (f.field or f.name) == field), None)
    return f"{_ZERO[kind]} ({UNSET})" if kind in _ZERO else UNSET


def split(flags: str | Sequence[str]) -> list[str]:
    """The tokens of an XLA_FLAGS string (split as a shell would), or of a list of tokens."""
    if isinstance(flags, str):
        try:
            return shlex.split(flags)
        except ValueError as exc:
            raise ValueError(f"cannot split XLA flags {flags!r}: {exc}") from None
    if isinstance(flags, Sequence) and all(isinstance(t, str) for t in flags):
        return list(flags)
    raise TypeError(
        "XLA flags are a string such as '--xla_dump_to=/tmp/d --xla_dump_hlo_as_text' or a "
        f"list of '--name=value' strings; got {flags!r}"
    )


def parse(flags: str | Sequence[str]) -> list[tuple[str, str]]:
    """``(name, value)`` pairs of an XLA_FLAGS string or of ``--name=value`` tokens.

    A bare ``--name`` means ``--name=true``, as XLA reads it for booleans.
    """
    pairs: list[tuple[str, str]] = []
    tokens = split(flags)
    for at, token in enumerate(tokens):
        dash = re.match(r"[-\u2010-\u2015\u2212\ufe58\ufe63\uff0d]+", str(token))
        if dash and set(dash.group()) - {"-"}:
            import unicodedata

            odd = " and ".join(
                f"{c!r} ({unicodedata.name(c, 'a dash').lower()}, U+{ord(c):04X})"
                for c in sorted(set(dash.group()) - {"-"})
            )
            raise ValueError(
                f"XLA flag {token!r} starts with {odd}, not two ASCII hyphens: web pages turn "
                f"'--' into a dash. Type it as --{str(token)[dash.end() :]}"
            )
        name, sep, value = str(token)[2:].partition("=")
        if not str(token).startswith("--") and at and "=" in str(tokens[at - 1]):
            raise ValueError(_split_value(str(tokens[at - 1]), str(token)))
        if not str(token).startswith("--") or not re.fullmatch(r"[A-Za-z_]\w*", name):
            raise ValueError(
                f"XLA flag {token!r} must look like --name=value, e.g. --xla_dump_to=/tmp/d "
                "(XLA reads a word without '--' as a file of flags; '-name' is unknown)"
            )
        pairs.append((name, value if sep else "true"))
    return pairs


def _split_value(flag: str, rest: str) -> str:
    """What to say when a value was split at a space: ``flag`` then ``rest``."""
    name, _, value = flag.partition("=")
    quoted = f'{name}="{value} {rest}"'
    return (
        f"XLA flag {flag!r} is followed by {rest!r}: a value split at a space. XLA splits its "
        f"flags at spaces too, so put a value with a space in double quotes: {quoted} (in a "
        f"shell: XLA_FLAGS='{quoted}', or labkit flags check '{quoted}')"
    )


def join_flags(tokens: Sequence[str]) -> str:
    """An XLA_FLAGS string; values with spaces get double quotes, which XLA understands."""
    quoted = ('{0}="{2}"'.format(*t.partition("=")) if re.search(r"\s", t) else t for t in tokens)
    return " ".join(quoted)


def typed_value(name: str, value: str) -> str | bool | int:
    """``value`` as jax ``compiler_options`` need it: XLA rejects the string 'true' there."""
    kind = REGISTRY[name].kind if name in REGISTRY else None
    low = value.lower()
    if kind == "bool" or (kind is None and low in ("true", "false")):
        if low not in ("true", "false", "1", "0"):
            raise ValueError(f"--{name}={value}: expected true or false")
        return low in ("true", "1")
    if kind == "int" or (kind is None and re.fullmatch(r"-?\d+", value)):
        if not re.fullmatch(r"-?\d+", value):
            raise ValueError(f"--{name}={value}: expected an integer")
        return int(value)
    if kind in ("enum", "enum-list"):  # XLA_FLAGS take "on" or "-FUSION"; compiler_options not
        if re.search(r"(^|,)[+-]", value):
            raise ValueError(f"--{name}={value}: +/- edits work in XLA_FLAGS only; list all")
        prefix = REGISTRY[name].prefix
        items = (
            v.upper() if v.upper().startswith(prefix) else prefix + v.upper()
            for v in value.split(",")
        )
        return ",".join(items) if value else ""
    return value


def compile_options(flags: str | Sequence[str]) -> dict[str, CompilerOption]:
    """A ``compiler_options`` dict for ``jax.jit(f).lower(x).compile(compiler_options=...)``.

    Per compile, an unknown name raises (jax.errors.JaxRuntimeError) instead of killing the
    process. Old names are translated to the option they set; removed ones raise FlagError.
    """
    options: dict[str, CompilerOption] = {}
    for name, value in parse(flags):
        if name in REMOVED:
            raise FlagError(f"--{name} was removed from XLA; instead: {REMOVED[name].replacement}")
        if name in REGISTRY and REGISTRY[name].field:
            options[REGISTRY[name].field] = _P + ("ON" if typed_value(name, value) else "DEFAULT")
        else:
            options[name] = typed_value(name, value)
    return options
