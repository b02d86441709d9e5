"""GEMM tiles for deviceless GPU compiles: XLA's untuned pick, or a stated rule XLA loads.

A deviceless compile cannot time kernels, so XLA gives each Triton GEMM fusion the first
config that compiles: 16x8 output tiles, 2 warps, 1 stage, which the tensor cores run as
Ampere-style ``mma.sync`` (FP8 operands widened to f16). That is ``tiles="untuned"``.

``tiles="rule"`` gives each GEMM fusion the config :func:`rule` picks for its shape and
operand type, and hands it to XLA the way XLA takes autotuning results, so the rest of the
pipeline (the split-K rewrite, Triton, LLVM, ptxas, scheduling) stays XLA's own:

1. The program is compiled once up to XLA's config assignment and stopped there (an
   unregistered ``xla_force_config`` backend fails the pass before it assigns anything);
   the module XLA dumps just before (``*.before_config_assignment.txt``) holds each GEMM
   fusion as XLA keys it.
2. Each fusion gets an autotune result under XLA's own key, ``<key model='<device>',
   hlo='<the fusion's computation, canonically printed>', version=N>``
   (openxla/xla ``xla/service/gpu/autotuning/autotune_cache_key.cc``), written as XLA's
   per-fusion cache folder holds them: one ``AutotuneResult`` text proto per key, named by
   the URL-safe base64 of the key's SHA-256 (``autotuner_cache.cc``, formerly
   ``autotuner_util.cc``).
3. The program is compiled again with ``xla_gpu_per_fusion_autotune_cache_dir`` on that
   folder (read only) and XLA's legacy cache (``xla_gpu_use_new_autotune_cache_format=
   false``): the config assigner finds every GEMM in the cache, as after a real autotune.
4. Every GEMM fusion of the compiled program is checked against its config; one that XLA
   did not take raises (a changed key format fails loudly, it never falls back silently).

Why not ``xla_gpu_load_autotune_results_from``, XLA's results file: measured here, jaxlib
0.12 loads that file once per process (``absl::call_once`` in ``GpuCompiler::
LoadAutotuneResultsFromFile``), so a second file is silently ignored, and with XLA's default
new cache format it does not consult the file's legacy entries at all. The per-fusion
folder is read at every lookup. :func:`autotune_results` still writes the same entries as
one ``AutotuneResults`` file (the format ``xla_gpu_dump_autotune_results_to`` writes) for
reading and exchange.

XLA also keeps every result it has read in a process-wide table, so within a process a
fusion keeps the first config it was given: :func:`rule` is a pure function of the fusion,
and a compile that asks another config for a fusion already served raises. Untuned compiles
use XLA's default (new-format) cache and never see that table.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from labkit.core.hardware import hardware

if TYPE_CHECKING:
    from jax.stages import Compiled, Lowered

__all__ = [
    "CACHE_KEY_VERSION",
    "COMPILED_GEMM_KIND",
    "GEMM_KIND",
    "RULE_LABEL",
    "TILES",
    "UNTUNED_LABEL",
    "Device",
    "GemmFusion",
    "TileConfig",
    "TilesNotTaken",
    "autotune_results",
    "cache_file_name",
    "cache_key",
    "cache_marker",
    "check_config",
    "compile_with_rule",
    "compiled_configs",
    "compiled_gemms",
    "default_tiles",
    "device_for",
    "gemm_fusions",
    "label",
    "rule",
    "verify",
    "write_cache_folder",
]

type Tiles = Literal["untuned", "rule"]
TILES: tuple[Tiles, ...] = ("untuned", "rule")
UNTUNED_LABEL = "tiles untuned: XLA's first config that compiles (a deviceless compile cannot time)"
RULE_LABEL = (
    "tiles chosen by the kit's rule (XLA's Hopper search-space limits, NVIDIA's tile and wave "
    "guidance), not timed on a GPU"
)
# AutotuneCacheKey::kCurrentVersion of the installed XLA (read from its cache-miss log line,
# "version=56"). A wrong value makes every key miss, which compile_with_rule reports.
CACHE_KEY_VERSION = 56
RESULTS_VERSION = 3  # AutotuneResults.version XLA accepts (kVersion in its autotune cache)
# Options of the second compile: XLA's legacy cache, which reads the per-fusion folder.
_LEGACY_CACHE = {
    "xla_gpu_use_new_autotune_cache_format": False,
    "xla_gpu_experimental_autotune_cache_mode": "AUTOTUNE_CACHE_MODE_READ",
}
# The first compile stops at config assignment: a forced config naming a backend the GPU
# orchestrator has not registered fails ConfigAssigner::Create, after XLA's dump of the
# module as the assigner sees it.
_STOP = {"xla_force_config": "backend: YNNPACK"}
_STOP_MESSAGE = "is not registered with the orchestrator"
_MIB = 1 << 20


def default_tiles() -> Tiles:
    """The tiles a compile gets when none are named: ``$LABKIT_TILES`` (default ``rule``).

    The kit's H100 program is the tuned-like one wherever it shows kernels: the rule's
    tiles. ``LABKIT_TILES=untuned`` gives what a deviceless compile does alone.
    """
    value = os.environ.get("LABKIT_TILES", "rule").strip().lower() or "rule"
    if value not in TILES:
        raise ValueError(f"LABKIT_TILES must be one of {', '.join(TILES)}, got {value!r}")
    return value


def label(tiles: Tiles) -> str:
    """The words that say where a program's GEMM tiles came from."""
    return RULE_LABEL if tiles == "rule" else UNTUNED_LABEL


@dataclasses.dataclass(frozen=True)
class Device:
    """What XLA's autotune key and the rule need of a GPU: its key string, SMs, shared memory.

    ``model`` is XLA's ``DeviceDescriptionToCacheKey`` of the deviceless target: compute
    capability, cores, clock, bandwidth, L2 and the cuDNN version (0.0.0: a compile-only
    device has none).
    """

    name: str
    model: str
    sm_count: int
    shared_memory: int  # bytes one block may opt in to (227 KB on sm_90 and sm_100)


def _number(x: float) -> str:
    """A double as absl::StrCat prints it (six significant digits, no trailing zeros)."""
    return f"{x:.6g}"


@functools.cache
def device_for(kind: str) -> Device:
    """The :class:`Device` of a deviceless target, by device_kind or hardware-table name."""
    hw = hardware(kind)
    if hw.sm_count is None or hw.clock_ghz is None or hw.l2_mb is None:
        raise ValueError(f"{hw.name} lacks SM count, clock or L2 in the hardware table")
    major, minor = hw.compute_capability
    model = (
        f"CUDA: {major}.{minor}, Cores: {hw.sm_count}, GPU clock: {_number(hw.clock_ghz)} GHz, "
        f"Memory bandwidth: {_number(round(hw.hbm_gbps))} GB/s, L2 cache: "
        f"{_number(round(hw.l2_mb * _MIB) / _MIB)} MB, DNN version: 0.0.0"
    )
    # 227 KB opt-in shared memory per block on compute capability 9.0 and 10.0 (CUDA C
    # Programming Guide, technical specifications per compute capability).
    return Device(hw.name, model, hw.sm_count, 232448)


_BITS = {"f8e4m3fn": 8, "f8e5m2": 8, "bf16": 16, "f16": 16, "f32": 32, "s8": 8, "f64": 64}


@dataclasses.dataclass(frozen=True)
class GemmFusion:
    """One Triton GEMM fusion as XLA's config assigner sees it.

    ``key_hlo`` is its computation printed as XLA's autotune key prints it; ``batch``, ``m``,
    ``n``, ``k`` the dot's batch, rows, columns and contracting size; ``lhs`` and ``rhs``
    the element types the dot multiplies.
    """

    name: str
    key_hlo: str
    batch: int
    m: int
    n: int
    k: int
    lhs: str
    rhs: str

    @property
    def bits(self) -> int:
        """The wider operand's bits per element (XLA's Triton GEMMs read equal widths)."""
        return max(_BITS.get(self.lhs, 32), _BITS.get(self.rhs, 32))

    def describe(self) -> str:
        """``gemm_fusion_dot.3 (bf16 x bf16, 4 x 256x192x64)``: name, types, BxMxNxK."""
        batch = f"{self.batch} x " if self.batch > 1 else ""
        return f"{self.name} ({self.lhs} x {self.rhs}, {batch}{self.m}x{self.n}x{self.k})"


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """A Triton GEMM config, the fields of XLA's ``AutotuneResult.TritonGemmKey``."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_stages: int = 1
    num_warps: int = 4
    num_ctas: int = 1

    def textproto(self) -> str:
        """The ``triton { ... }`` text of an ``AutotuneResult``."""
        fields = " ".join(f"{f.name}: {getattr(self, f.name)}" for f in dataclasses.fields(self))
        return f"triton {{ {fields} }}"

    def describe(self) -> str:
        """``128x128x64, 4 warps, 4 stages`` (split-K named when there is one)."""
        split = f", split-K {self.split_k}" if self.split_k > 1 else ""
        stages = "stage" if self.num_stages == 1 else "stages"
        return (
            f"{self.block_m}x{self.block_n}x{self.block_k}, {self.num_warps} warps, "
            f"{self.num_stages} {stages}{split}"
        )

    def shared_memory(self, bits: int) -> int:
        """Bytes of shared memory its pipeline holds: one lhs and one rhs tile per stage."""
        return (self.block_m + self.block_n) * self.block_k * bits // 8 * self.num_stages

    @property
    def wgmma_ready(self) -> bool:
        """Whether Triton can issue Hopper wgmma for it: 64-row tiles, whole warpgroups."""
        return self.block_m % 64 == 0 and self.num_warps % 4 == 0


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


def _tiles(gemm: GemmFusion, block_m: int, block_n: int) -> int:
    return gemm.batch * math.ceil(gemm.m / block_m) * math.ceil(gemm.n / block_n)


def rule(gemm: GemmFusion, device: Device | None = None) -> TileConfig:
    """The kit's tile config for one GEMM fusion on an H100-class GPU (not timed anywhere).

    Sources: XLA's own Hopper search space (openxla/xla ``xla/backends/gpu/autotuner/triton/
    dot_search_space.cc``: wgmma needs output tiles of at least 64 rows and 4 warps, a
    warpgroup; a tile's pipeline must fit the block's opt-in shared memory; a config has
    "not enough tiles" when it has fewer output tiles than the GPU has SMs), XLA's H100
    default configs (``xla/backends/gpu/autotuner/triton/default_configs/h100.txtpb``, the
    set a deviceless compile takes the first of and a GPU autotune times: 128x256 and
    256x128 tiles with 8 warps, 128x128, 128x64 and 64x128 with 4, 3 or 4 stages), NVIDIA's
    *Matrix Multiplication Background User's Guide* (Deep Learning Performance docs,
    "Dimension Quantization Effects": prefer the largest tile that still gives every SM
    work, smaller tiles when the output is small), and the PTX ISA's wgmma shapes (K per
    instruction: 16 for bf16/f16, 32 for e4m3/e5m2, 8 for tf32, which Triton rounds up to 16).

    1. ``block_k``: 128 bytes of K per row (64 for 16-bit, 128 for 8-bit, 32 for 32-bit
       operands), at least one wgmma K step, at most K rounded up to a power of two.
    2. Output tile: the first of 128x256, 256x128, 128x128, 64x128, 128x64, 64x64 (for
       M > N the wider side goes along M; each side capped at its dimension rounded up to a
       power of two, at least 64 rows and 16 columns) that has at least as many tiles as the
       GPU has SMs; when none has, the last (smallest). Every tile is wgmma-shaped: where a
       real autotune may prefer Ampere-style 16x8 tiles for a GEMM too small to fill the GPU
       (XLA's search space allows them then), the rule keeps Hopper's warpgroup MMA.
    3. ``num_warps``: 8 for tiles of 128x256 elements or more, else 4.
    4. ``num_stages``: as many as fit the shared memory, at most 4 and at most the K steps.
    5. ``split_k`` 1: XLA's own split-K heuristic (``splitk-rewriter``, ``ChooseSplitK`` in
       ``xla/service/gpu/transforms/splitk_rewriter.cc``, tuned on H100s) has already split
       K before configs are assigned, in the untuned program as in this one; a split GEMM
       reaches the rule with the split as a batch dimension.
    """
    dev = device or device_for("H100 SXM")
    bits = gemm.bits
    block_k = max(_min_block_k(bits), min(1024 // bits, _pow2_ceil(gemm.k)))
    m_cap, n_cap = max(64, _pow2_ceil(gemm.m)), max(16, _pow2_ceil(gemm.n))
    wide = [(128, 256), (256, 128)] if gemm.n >= gemm.m else [(256, 128), (128, 256)]
    half = [(64, 128), (128, 64)] if gemm.n >= gemm.m else [(128, 64), (64, 128)]
    shapes = [*wide, (128, 128), *half, (64, 64)]
    candidates = list(dict.fromkeys((min(m, m_cap), min(n, n_cap)) for m, n in shapes))
    block_m, block_n = next(
        ((m, n) for m, n in candidates if _tiles(gemm, m, n) >= dev.sm_count), candidates[-1]
    )
    num_warps = 8 if block_m * block_n >= 128 * 256 else 4
    stage = TileConfig(block_m, block_n, block_k, 1, 1, num_warps).shared_memory(bits)
    num_stages = max(1, min(4, math.ceil(gemm.k / block_k), dev.shared_memory // stage))
    return TileConfig(block_m, block_n, block_k, 1, num_stages, num_warps)


def _min_block_k(bits: int) -> int:
    """The smallest K tile: one wgmma K step (32 for 8-bit), and Triton's floor of 16."""
    return 32 if bits <= 8 else 16


def check_config(config: TileConfig, gemm: GemmFusion, device: Device | None = None) -> None:
    """Raise ValueError, saying what is wrong, unless ``config`` is a valid one for ``gemm``."""
    dev = device or device_for("H100 SXM")
    problems = []
    powers = ("block_m", "block_n", "block_k", "split_k", "num_warps")
    for name in powers:
        value = getattr(config, name)
        if value < 1 or value & (value - 1):
            problems.append(f"{name}={value} is not a power of two")
    limits = {"block_m": (16, 256), "block_n": (8, 256), "block_k": (16, 512)}
    for name, (low, high) in limits.items():
        if not low <= getattr(config, name) <= high:
            problems.append(f"{name}={getattr(config, name)} is outside {low}..{high}")
    if config.block_m > max(64, _pow2_ceil(gemm.m)) or config.block_n > max(16, _pow2_ceil(gemm.n)):
        problems.append(
            f"a {config.block_m}x{config.block_n} tile is larger than the {gemm.m}x{gemm.n} "
            "output needs (each side at most its dimension rounded up to a power of two)"
        )
    if config.block_k * config.split_k > max(_min_block_k(gemm.bits), _pow2_ceil(gemm.k)):
        problems.append(f"block_k x split_k = {config.block_k * config.split_k} exceeds K={gemm.k}")
    if config.split_k > 1 and gemm.k % (config.split_k * config.block_k):
        problems.append(f"K={gemm.k} is not divisible by split_k x block_k")
    if not 1 <= config.num_warps <= 32:
        problems.append(f"num_warps={config.num_warps} is outside 1..32 (1024 threads a block)")
    if config.num_stages < 1 or config.num_ctas != 1:
        problems.append("num_stages must be >= 1 and num_ctas 1")
    smem = config.shared_memory(gemm.bits)
    if smem > dev.shared_memory:
        problems.append(
            f"its pipeline needs {smem} bytes of shared memory, more than the {dev.name}'s "
            f"{dev.shared_memory} ({dev.shared_memory // 1024} KB) a block may use"
        )
    if problems:
        raise ValueError(
            f"tile config {config.describe()} is not valid for {gemm.describe()}: "
            + "; ".join(problems)
            + ". Use smaller tiles or fewer stages (labkit.xla.tiles.rule gives valid ones)."
        )


# --- reading the module XLA dumps before config assignment ----------------------------

_FUSION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?\bfusion\(.*?calls=%?([\w.\-]+)", re.M)
GEMM_KIND = "__triton_gemm"  # a Triton GEMM fusion before config assignment
COMPILED_GEMM_KIND = "__triton_nested_gemm_fusion"  # one after it, in compiled HLO
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([\d,]*)\]")
_DOT = re.compile(r"=\s*\S+\s+dot\(([^)]*)\)(.*)$", re.M)
_CONSTANT = re.compile(r"^(\s*\S+ = )((?:[a-z][a-z0-9]*)\[[^\]]*\]\S*) constant\((.*)\)(.*)$")
_NUMBER = re.compile(r"-?(?:\d+\.?\d*(?:e[-+]?\d+)?|inf|nan|true|false)")


def _essential_constant(shape: str, value: str) -> str:
    """A constant's operand text under XLA's ``print_only_essential_constants``."""
    numbers = _NUMBER.findall(value)
    as_float = [
        1.0 if v == "true" else 0.0 if v == "false" else float(v) for v in numbers if v != "nan"
    ]
    if numbers and len(as_float) == len(numbers) and all(v == 0 for v in as_float):
        return "0"
    if numbers and len(as_float) == len(numbers) and all(v == 1 for v in as_float):
        return "1"
    if re.match(r"[su]\d+\[", shape):
        return value
    return "{...}"


def _key_text(block: str) -> str:
    """A computation from a canonical module print, as XLA's autotune key prints it: no name,
    no called computations, only essential constants."""
    lines = block.splitlines()
    out = ["{"]
    skip_until: str | None = None
    for line in lines[1:]:
        if skip_until is not None:  # inside a called computation's body
            if line.startswith(skip_until + "}"):
                out[-1] += line[len(skip_until) + 1 :]
                skip_until = None
            continue
        called = re.match(r"^(.*?), (?:to_apply|calls|condition|body|branch_computations)=$", line)
        if called:
            out.append(called.group(1))
            skip_until = re.match(r"^\s*", line).group(0)  # type: ignore[union-attr]
            continue
        if m := _CONSTANT.match(line):
            value = _essential_constant(m.group(2), m.group(3))
            line = f"{m.group(1)}{m.group(2)} constant({value}){m.group(4)}"
        out.append(line)
    return "\n".join(out)


def _dims(shape: str) -> list[int]:
    m = _ARRAY.search(shape)
    return [int(d) for d in m.group(2).split(",") if d] if m else []


def _gemm_of(name: str, key_hlo: str) -> GemmFusion | None:
    dot = _DOT.search(key_hlo)
    if dot is None:
        return None
    operands = [p.strip() for p in re.split(r",\s*(?=[a-z][a-z0-9]*\[)", dot.group(1))]
    if len(operands) != 2:
        return None
    lhs, rhs = (_dims(o) for o in operands)
    types = [_ARRAY.match(o).group(1) for o in operands]  # type: ignore[union-attr]
    attrs = dict(re.findall(r"(\w+_dims)=\{([\d,]*)\}", dot.group(2)))

    def size(dims: list[int], key: str) -> int:
        return math.prod(dims[int(i)] for i in attrs.get(key, "").split(",") if i)

    batch, k = size(lhs, "lhs_batch_dims"), size(lhs, "lhs_contracting_dims")
    m = math.prod(lhs) // (batch * k)
    n = math.prod(rhs) // (batch * k)
    return GemmFusion(name, key_hlo, batch, m, n, k, types[0], types[1])


_BLOCK = re.compile(
    r"^(?:ENTRY\s+)?%?([\w.\-]+)[ \t]*(?:\([^\n]*)?\{[ \t]*\n.*?^\}[ \t]*$", re.M | re.S
)
_CALLED = re.compile(r"\b(?:calls|to_apply|condition|body|branch_computations)=\{?%?([\w.\-]+)")
_CONTROL = re.compile(r", control-predecessors=\{[^}]*\}")


def _fusion_module(blocks: Mapping[str, str], computation: str) -> str:
    """A module of one fusion's computation (as its entry) and what it calls: jaxlib's HLO
    parser reads it where it rejects a whole dumped module (forward control edges)."""
    called, todo = [], [computation]
    while todo:
        name = todo.pop()
        if name not in called and name in blocks:
            called.append(name)
            todo += _CALLED.findall(blocks[name].split("\n", 1)[1])
    others = [blocks[name] for name in reversed(called[1:])]
    return "\n\n".join(["HloModule gemm_fusion", *others, "ENTRY " + blocks[computation]])


def gemm_fusions(module_text: str) -> list[GemmFusion]:
    """The Triton GEMM fusions of a module as XLA dumps it before config assignment.

    Reads each fusion's computation with XLA's own HLO parser and canonical printer
    (``jaxlib``'s ``xla_client.hlo``) and turns it into XLA's key text.
    """
    from jaxlib import xla_client

    options = xla_client.hlo.HloPrintOptions.canonical()
    options.print_large_constants = True
    text = _CONTROL.sub("", module_text)
    blocks = {m.group(1): m.group(0).removeprefix("ENTRY ") for m in _BLOCK.finditer(text)}
    found = []
    for line in text.splitlines():
        if f'"kind":"{GEMM_KIND}"' not in line or (m := _FUSION.match(line)) is None:
            continue
        name, computation = m.groups()
        if computation not in blocks:
            continue
        module = xla_client.hlo.hlo_module_from_text(_fusion_module(blocks, computation))
        canonical = module.to_string(options)
        entry = canonical[canonical.index("\nENTRY ") + 1 :].split("\n\n", 1)[0]
        if gemm := _gemm_of(name, _key_text(entry.rstrip())):
            found.append(gemm)
    return found


# --- what XLA reads --------------------------------------------------------------------


def cache_key(device: Device, key_hlo: str) -> str:
    """XLA's ``AutotuneCacheKey::ToString()`` of one fusion on ``device``."""
    return f"<key model='{device.model}', hlo='{key_hlo}', version={CACHE_KEY_VERSION}>"


def cache_file_name(device: Device, key_hlo: str) -> str:
    """The file XLA's per-fusion cache reads for that key: URL-safe base64 of its SHA-256."""
    digest = hashlib.sha256(cache_key(device, key_hlo).encode()).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=") + ".textproto"


def write_cache_folder(
    folder: Path, device: Device, plan: Mapping[GemmFusion, TileConfig]
) -> list[Path]:
    """Write one ``AutotuneResult`` text proto per fusion where XLA's per-fusion cache looks."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for gemm, config in plan.items():
        path = folder / cache_file_name(device, gemm.key_hlo)
        path.write_text(config.textproto() + "\n")
        written.append(path)
    return written


def autotune_results(device: Device, plan: Mapping[GemmFusion, TileConfig]) -> str:
    """The same entries as one ``AutotuneResults`` text proto (what XLA dumps and loads)."""
    entries = sorted({(gemm.key_hlo, config) for gemm, config in plan.items()}, key=str)
    out = [f"version: {RESULTS_VERSION}"]
    for key_hlo, config in entries:
        out += [
            "results {",
            f"  device: {json.dumps(device.model)}",
            f"  hlo: {json.dumps(key_hlo)}",
            f"  result {{ {config.textproto()} }}",
            f"  version: {CACHE_KEY_VERSION}",
            "}",
        ]
    return "\n".join(out) + "\n"


# --- reading what XLA did ---------------------------------------------------------------


def _compiled_gemm_fusions(hlo: str) -> list[tuple[Any, Any]]:
    """(fusion, its dot) for each Triton GEMM fusion of compiled HLO."""
    from labkit.xla.hlo_text import parse_module

    module = parse_module(hlo)
    found = []
    for inst in (i for insts in module.computations.values() for i in insts):
        config = inst.backend_config().get("fusion_backend_config", {})
        if inst.opcode != "fusion" or config.get("kind") != COMPILED_GEMM_KIND:
            continue
        for callee in inst.callees("calls"):
            body = module.computations.get(callee, ())
            dot = next((sub for sub in body if sub.opcode == "dot"), None)
            if dot is not None:
                found.append((inst, dot))
    return found


def compiled_configs(hlo: str) -> dict[str, TileConfig]:
    """The tile config of each Triton GEMM fusion in compiled HLO, by fusion name.

    XLA turns a config into ``block_level_fusion_config`` (output tile, warps, stages) on the
    fusion and the contracting tile (``sizes``) on its dot. The output tile is in the order
    of the fusion's result, which may be a bitcast or transpose of the dot's, with a tile
    of 1 for each batch dimension wherever the result puts it: the two other sides are read.
    """
    found = {}
    for inst, dot in _compiled_gemm_fusions(hlo):
        level = inst.backend_config()["fusion_backend_config"].get("block_level_fusion_config", {})
        tile = [int(s) for s in (level.get("output_tiles") or [{}])[0].get("sizes", [])]
        sides = [s for s in tile if s != 1] if sum(s != 1 for s in tile) == 2 else tile[-2:]
        block_k = int((dot.backend_config().get("sizes") or [0])[0])
        if len(sides) == 2:
            found[inst.name] = TileConfig(
                sides[0],
                sides[1],
                block_k,
                1,
                int(level.get("num_stages", 1)),
                int(level.get("num_warps", 1)),
                int(level.get("num_ctas", 1)),
            )
    return found


def compiled_gemms(hlo: str) -> list[GemmFusion]:
    """The Triton GEMM fusions of compiled HLO with their dots' shapes and types (no key)."""
    from labkit.xla.hlo_text import parse_module

    module, out = parse_module(hlo), []
    for inst, dot in _compiled_gemm_fusions(hlo):
        shapes = module.shapes(dot.computation)
        operands = [shapes.get(name, "") for name in dot.operands]
        attrs = " ".join(f"{k}={v}" for k, v in dot.attributes.items() if k.endswith("_dims"))
        text = f"= {dot.shape} dot({', '.join(f'{o} x' for o in operands)}), {attrs}"
        if (gemm := _gemm_of(inst.name, text)) is not None:
            out.append(dataclasses.replace(gemm, key_hlo=""))
    return out


class TilesNotTaken(RuntimeError):
    """XLA compiled a GEMM fusion with another config than the one the kit gave it."""


# Fusions served in this process and the config each got: XLA's own table keeps the first.
_SERVED: dict[tuple[str, str], TileConfig] = {}


def cache_marker(tiles: Tiles) -> dict[str, str]:
    """What the kit's compile cache adds to a compile's key for these tiles ({} untuned):
    the rule's identity (the sources of this module and of the hardware table it reads),
    which with the program decides the configs."""
    if tiles == "untuned":
        return {}
    from labkit.core import hardware as table

    h = hashlib.sha256()
    for source in (Path(__file__), Path(table.__file__)):
        h.update(source.read_bytes())
    return {"labkit_tiles": f"{tiles}:{h.hexdigest()[:16]}"}


def _stop_before_assignment(
    lowered: Lowered, options: Mapping[str, Any], folder: Path
) -> str | None:
    """Compile up to XLA's config assignment; the module text it dumped there (None: the
    compile went through, so nothing was left to assign)."""
    probe = {k: v for k, v in options.items() if not str(k).startswith("xla_dump")}
    probe.update({**_STOP, "xla_dump_to": str(folder)})
    try:
        lowered.compile(compiler_options=probe)
    except Exception as exc:  # XLA's error type depends on the jaxlib; checked just below
        if _STOP_MESSAGE not in str(exc):
            raise
    else:
        return None
    dumps = sorted(folder.glob("*before_config_assignment.txt"))
    if not dumps:
        raise RuntimeError(
            "XLA dumped no *.before_config_assignment.txt before stopping at config "
            f"assignment (in {folder}); this jaxlib does not work with tiles='rule': use "
            "tiles='untuned'"
        )
    return dumps[-1].read_text()


@functools.cache
def _folders() -> Path:
    """This process's folder of per-fusion cache folders (removed at exit)."""
    from labkit.core.env import scratch_dir

    return scratch_dir("labkit-tiles-")


def _plan_folder(device: Device, plan: Mapping[GemmFusion, TileConfig]) -> Path:
    """The per-fusion cache folder of ``plan``, named by its contents: the same plan gives the
    same folder, so the same compile options (and JAX's in-process cache behaves as for an
    untuned compile)."""
    files = {cache_file_name(device, g.key_hlo): c.textproto() for g, c in plan.items()}
    digest = hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()[:24]
    folder = _folders() / digest
    if not folder.is_dir():
        staging = _folders() / f"{digest}.{os.getpid()}.tmp"
        write_cache_folder(staging, device, plan)
        staging.rename(folder)
    return folder


def compile_with_rule(
    lowered: Lowered, options: Mapping[str, Any], kind: str
) -> tuple[Compiled, dict[GemmFusion, TileConfig], float]:
    """Compile ``lowered`` with :func:`rule`'s config for every GEMM fusion (module docstring).

    ``kind`` is the target's device_kind. Returns the compiled program, the plan (fusion ->
    config) and the seconds both compiles took. Raises :class:`TilesNotTaken` when XLA used
    another config for a fusion than the plan's.
    """
    device = device_for(kind)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="labkit-tiles-") as tmp:
        module = _stop_before_assignment(lowered, options, Path(tmp) / "dump")
        plan = {} if module is None else {gemm: rule(gemm, device) for gemm in gemm_fusions(module)}
        if not plan:  # no Triton GEMM fusion (or none left to assign): the untuned program
            compiled = (
                lowered.compile(compiler_options=dict(options)) if options else lowered.compile()
            )
            return compiled, {}, time.perf_counter() - start
        for gemm, config in plan.items():
            check_config(config, gemm, device)
            served = _SERVED.get((device.model, gemm.key_hlo))
            if served is not None and served != config:
                raise TilesNotTaken(
                    f"{gemm.describe()} was given {served.describe()} earlier in this process "
                    f"and XLA keeps the first config a process reads; {config.describe()} "
                    "needs a fresh process (restart the kernel)"
                )
    folder = _plan_folder(device, plan)
    final = {**options, **_LEGACY_CACHE, "xla_gpu_per_fusion_autotune_cache_dir": str(folder)}
    compiled = lowered.compile(compiler_options=final)
    seconds = time.perf_counter() - start
    for gemm, config in plan.items():
        _SERVED[(device.model, gemm.key_hlo)] = config
    verify(plan, compiled.as_text() or "")
    return compiled, plan, seconds


def verify(plan: Mapping[GemmFusion, TileConfig], hlo: str) -> None:
    """Raise :class:`TilesNotTaken` unless every planned fusion compiled with its config.

    A fusion whose result is a bitcast or transpose of its dot carries the output tile in
    the result's dimension order, so the two output sides may read swapped.
    """
    got = compiled_configs(hlo)
    wrong = []
    for gemm, config in plan.items():
        have = got.get(gemm.name)
        if have is None or not _same(have, config):
            found = have.describe() if have else "no Triton GEMM fusion of that name"
            wrong.append(f"{gemm.describe()}: wanted {config.describe()}, got {found}")
    if wrong:
        raise TilesNotTaken(
            f"XLA did not take {len(wrong)} of {len(plan)} tile configs (its autotune key "
            "may have changed in this jaxlib; compile with tiles='untuned'): "
            + "; ".join(wrong[:3])
        )


def _same(have: TileConfig, want: TileConfig) -> bool:
    sides = {(want.block_m, want.block_n), (want.block_n, want.block_m)}
    rest = dataclasses.replace(have, block_m=want.block_m, block_n=want.block_n)
    return (have.block_m, have.block_n) in sides and rest == want
