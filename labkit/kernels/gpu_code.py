"""The code of compiled GPU kernels, read from deviceless compiles: PTX, ptxas, MMA instructions.

A deviceless compile (:mod:`labkit.xla.aot`) runs XLA's whole GPU pipeline, code generation
and ptxas included, so the tensor-core instructions a kernel would issue can be read without
a GPU:

- :func:`triton_code`: the LLVM-dialect code of every Triton kernel XLA emitted (its own
  Triton GEMM and softmax fusions, Pallas Triton kernels), from an ``xla_dump_to`` dump;
- :func:`mosaic_code`: the PTX and the ptxas report of every Mosaic GPU kernel
  (``MOSAIC_GPU_DUMP_PTX`` / ``MOSAIC_GPU_DUMP_PTXAS``, which jaxlib prints on file
  descriptor 1 while it compiles);
- :func:`mma_instructions`: the matrix-multiply instructions in either, by name: ``mma.sync``
  (Ampere-style, one warp), ``wgmma.mma_async`` (Hopper, a warpgroup of 4 warps),
  ``tcgen05.mma`` (Blackwell, tensor memory), with shapes and operand types;
- :func:`gemm_kernels`: what each Triton GEMM kernel of a program became: its tile config,
  its tensor-core instructions, the shared memory and threads XLA launches it with (XLA's
  thunk sequence) and the registers ptxas gave it (XLA's own ptxas calls, observed), kept on
  disk beside the kit's compile cache.

Nothing here runs a kernel. Dumps go to temporary folders that are removed on return.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from labkit.core.env import find_cuda_dir
from labkit.core.types import CompilerOptions, PyTree
from labkit.xla import compile_cache
from labkit.xla import tiles as gemm_tiles
from labkit.xla.aot import KERNEL_CACHE_OPTION, AotResult, compile_for_gpu
from labkit.xla.tiles import Tiles

if TYPE_CHECKING:
    import jax

# PTX text: wgmma.mma_async.sync.aligned.m64n128k32.f32.e5m2.e5m2, mma.sync.aligned...,
# tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale...
_PTX_MMA = re.compile(r"\b((?:wgmma\.mma_async|mma\.sync|tcgen05\.mma)(?:\.[\w:]+)*)")
# LLVM-dialect MLIR (Triton's output): "nvvm.mma.sync"(...) <{... attributes ...}>
_NVVM_MMA = re.compile(r'"nvvm\.(mma\.sync|wgmma\.mma_async)"\([^\n]*?<\{([^\n]*?)\}>')
_SHAPE = re.compile(r"shape = #nvvm\.shape<m = (\d+), n = (\d+), k = (\d+)>")
_TYPE = re.compile(r"(?:multiplicand[AB]PtxType|type[AB]) = #nvvm\.(?:mma|wgmma)_type<(\w+)>")

MOSAIC_DUMP_ENV = ("MOSAIC_GPU_DUMP_PTX", "MOSAIC_GPU_DUMP_PTXAS")


def mma_instructions(text: str) -> Counter[str]:
    """Matrix-multiply instructions in PTX or Triton's LLVM-dialect code, by name and types.

    PTX instructions keep their full name (``wgmma.mma_async.sync.aligned.m64n128k32.f32.
    e5m2.e5m2``); an ``nvvm`` op becomes ``mma.sync m16n8k16 f16 x f16`` (shape, then the
    operand types the tensor core multiplies).
    """
    found: Counter[str] = Counter()
    # Every pattern names "mma" and stays on one line: scan only those lines (a GPT step's
    # Triton code is megabytes, and the patterns are slow on the rest).
    text = "\n".join(line for line in text.splitlines() if "mma" in line)
    for op, attrs in _NVVM_MMA.findall(text):
        shape = _SHAPE.search(attrs)
        types = _TYPE.findall(attrs)
        mnk = "m{}n{}k{}".format(*shape.groups()) if shape else "?"
        found[f"{op} {mnk} {' x '.join(types) or '?'}"] += 1
    stripped = _NVVM_MMA.sub("", text)
    for name in _PTX_MMA.findall(stripped):
        if name.count(".") >= 2:  # an instruction, not a prose mention like "mma.sync"
            found[name] += 1
    return found


def triton_code(
    fn: Callable[..., PyTree],
    *args: PyTree,
    compiler_options: CompilerOptions | None = None,
    tiles: Tiles | None = None,
) -> tuple[AotResult, str]:
    """Compile ``fn(*args)`` deviceless and return it with the code of its Triton kernels.

    ``args`` are sharded on a compile-only GPU mesh (:func:`labkit.xla.aot.abstract`). The
    text is XLA's ``triton-to-llvm`` dump: LLVM-dialect MLIR, one module per Triton kernel,
    with the ``nvvm`` tensor-core ops (read them with :func:`mma_instructions`). ``tiles``
    picks the GEMM tiles (:func:`labkit.xla.aot.compile_for_gpu`).
    """
    with tempfile.TemporaryDirectory(prefix="labkit-triton-") as folder:
        options = {
            **dict(compiler_options or {}),
            "xla_dump_to": folder,
            "xla_gpu_dump_llvmir": True,
            "xla_dump_emitter_re": "triton",
        }
        _no_symbolizer()
        result = compile_for_gpu(fn, *args, compiler_options=options, tiles=tiles)
        text = "\n".join(p.read_text() for p in sorted(Path(folder).glob("*triton-to-llvm*")))
    return result, text


@dataclasses.dataclass(frozen=True)
class MosaicCode:
    """The PTX of the Mosaic GPU kernels of one compile, and what ptxas said of them."""

    result: AotResult
    ptx: str
    ptxas: str

    def ptxas_targets(self) -> list[str]:
        """The GPU architectures ptxas compiled an entry function for (``sm_90a``, ...)."""
        return re.findall(r"Compiling entry function '[^']*' for '(\w+)'", self.ptxas)


@contextlib.contextmanager
def redirect_fd(fd: int, path: str | Path) -> Iterator[None]:
    """Send file descriptor ``fd`` (1 or 2, where C++ code prints; Python's ``sys.stdout``
    and ``sys.stderr`` are not enough) to ``path`` (``os.devnull`` to drop it) for the
    duration."""
    (sys.stdout if fd == 1 else sys.stderr).flush()
    saved = os.dup(fd)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(target, fd)
    os.close(target)
    try:
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


def _no_symbolizer() -> None:
    """Set ``LLVM_DISABLE_SYMBOLIZATION=1`` in this process, for good.

    Once XLA has dumped a compile's Triton and Mosaic GPU passes, it attaches the C++ stack
    trace to every MLIR diagnostic for the rest of the process, and LLVM runs llvm-symbolizer
    for each one: seconds of CPU per compile for traces nobody prints (measured in 05: a later
    1-GPU FP8 compile took 36-73 s instead of 2 s). With it set, LLVM leaves raw addresses;
    only LLVM's own crash traces in this process lose their function names.
    """
    os.environ["LLVM_DISABLE_SYMBOLIZATION"] = "1"


@contextlib.contextmanager
def _environment(names: tuple[str, ...]) -> Iterator[None]:
    """Each of ``names`` set to ``"1"`` for the duration, then restored."""
    before = {name: os.environ.get(name) for name in names}
    os.environ.update(dict.fromkeys(names, "1"))
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def mosaic_code(
    fn: Callable[..., PyTree],
    *args: PyTree,
    compiler_options: CompilerOptions | None = None,
) -> MosaicCode:
    """Compile ``fn(*args)`` deviceless and return the PTX and ptxas report of its Mosaic kernels.

    jaxlib prints them on file descriptor 1 when ``MOSAIC_GPU_DUMP_PTX`` and
    ``MOSAIC_GPU_DUMP_PTXAS`` are set; both are set and the output captured only for this
    compile. The compile gets a fresh dump folder as an option, so XLA does not serve it from
    its cache; but jaxlib keeps each Mosaic GPU kernel it assembled in this process, and a
    kernel assembled before prints no ptxas report: then this raises (call it first).
    """
    with tempfile.TemporaryDirectory(prefix="labkit-mosaic-") as folder:
        log = Path(folder) / "stdout.txt"
        options = {**dict(compiler_options or {}), "xla_dump_to": str(Path(folder) / "xla")}
        _no_symbolizer()
        with _environment(MOSAIC_DUMP_ENV), redirect_fd(1, log):
            result = compile_for_gpu(fn, *args, compiler_options=options)
        text = log.read_text(errors="replace")
    ptxas = "\n".join(line for line in text.splitlines() if line.startswith("ptxas"))
    ptx = "\n".join(line for line in text.splitlines() if not line.startswith("ptxas"))
    if "Compiling entry function" not in ptxas:
        raise RuntimeError(
            "ptxas reported nothing for this compile: its Mosaic GPU kernel was assembled "
            "earlier in this process and jaxlib reused it. Read a kernel's code with "
            "labkit.kernels.gpu_code.mosaic_code before compiling it any other way (or in a "
            "new process)."
        )
    return MosaicCode(result, ptx, ptxas)


# ---------------------------------------------------------------------------------------
# What each GEMM kernel of a program became

REPORT_FORMAT = 1  # bump when what a stored report holds changes
# XLA's thunk sequence: "018: kCustomKernel [...] gemm_fusion_dot_78 grid: [12, 1, 1]
# threads: [128, 1, 1]  shared_memory: 49536 bytes" (thunk 18 may be another fusion, which
# reuses the kernel of an identical one), and its metadata: thunk id -> the fusion's name.
_THUNK = re.compile(
    r"^\s*(\d+): (?:kKernel|kCustomKernel) .*?\] (\S+) grid: \[[\d, ]+\] threads: "
    r"\[(\d+), (\d+), (\d+)\]\s+shared_memory: (\d+) bytes",
    re.M,
)
_ANNOTATION = re.compile(r'profile_annotation: "([^"]+)"\s+thunk_id: (\d+)')
_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")


_FP8_TYPES = frozenset({"e4m3", "e5m2"})
_FP8_KINDS = ("kind::f8f6f4", "kind::mxf8f6f4")  # tcgen05.mma kinds that multiply 8-bit floats


def multiplies(instruction: str) -> str:
    """What a tensor-core instruction (as :func:`mma_instructions` names it) multiplies:
    ``"e4m3 x e5m2"`` (wgmma, mma.sync), or a tcgen05.mma's kind, ``"kind::f8f6f4"``."""
    if instruction.startswith("tcgen05"):
        kind = re.search(r"kind::\w+", instruction)
        return kind.group(0) if kind else "?"
    if " x " in instruction:  # "mma.sync m16n8k16 f16 x f16": Triton's nvvm op
        return instruction.split(" ", 2)[2]
    types = instruction.split(".")[-2:]  # PTX: "...m64n64k32.f32.e4m3.e5m2"
    return " x ".join(types) if len(types) == 2 else "?"


def is_fp8(instruction: str) -> bool:
    """Whether a tensor-core instruction multiplies 8-bit floats (FP8 wgmma or mma.sync
    operands e4m3/e5m2, or tcgen05.mma of kind f8f6f4 / mxf8f6f4)."""
    what = multiplies(instruction)
    if what.startswith("kind::"):
        return any(kind in instruction for kind in _FP8_KINDS)
    return set(what.split(" x ")) <= _FP8_TYPES


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch of XLA's thunk sequence."""

    fusion: str  # the HLO fusion it runs
    kernel: str  # the kernel it launches (an identical fusion's, when XLA reuses one)
    threads: int  # threads per block
    shared_memory: int  # bytes of shared memory per block


def launches(thunk_sequence: str, thunk_metadata: str) -> list[Launch]:
    """The kernel launches of XLA's thunk sequence and metadata dumps, in order."""
    fusions = {int(i): name for name, i in _ANNOTATION.findall(thunk_metadata)}
    found = []
    for thunk, kernel, x, y, z, smem in _THUNK.findall(thunk_sequence):
        fusion = fusions.get(int(thunk), kernel)
        found.append(Launch(fusion, kernel, int(x) * int(y) * int(z), int(smem)))
    return found


@dataclasses.dataclass(frozen=True)
class GemmKernel:
    """One Triton GEMM fusion of a compiled program and what its tile config made of it."""

    fusion: str  # the HLO fusion
    kernel: str  # the kernel it launches (XLA reuses one kernel for identical fusions)
    config: str  # its tile config (TileConfig.describe(), the larger output side first)
    instructions: dict[str, int]  # tensor-core instructions in the kernel's code, by name
    shared_memory: int  # bytes per block XLA launches it with
    threads: int  # threads per block
    registers: int | None  # per thread, as ptxas -v reports it (None: ptxas not seen)

    @property
    def issues(self) -> str:
        """``"wgmma"``, ``"tcgen05.mma"``, ``"mma.sync"``, ``"mixed"`` or ``"none"``."""
        named = {"wgmma": "wgmma", "tcgen05": "tcgen05.mma", "mma": "mma.sync"}
        found = {named.get(k, k) for k in (n.split(".")[0] for n in self.instructions)}
        return found.pop() if len(found) == 1 else ("none" if not found else "mixed")

    @property
    def fp8(self) -> bool:
        """Whether its kernel multiplies FP8: every tensor-core instruction it issues does."""
        return bool(self.instructions) and all(is_fp8(n) for n in self.instructions)

    def multiplies(self) -> str:
        """What its instructions multiply, e.g. ``"e4m3 x e5m2"`` (``", "``-joined if several)."""
        return ", ".join(sorted({multiplies(n) for n in self.instructions})) or "nothing"


@dataclasses.dataclass(frozen=True)
class KernelReport:
    """The Triton GEMM fusions of one deviceless compile, with the program's kernel count."""

    tiles: Tiles  # where the GEMM tiles came from (labkit.xla.tiles)
    kernels: int  # kernel launches in XLA's thunk sequence (copies and collectives apart)
    gemms: tuple[GemmKernel, ...]

    def instructions(self) -> Counter[str]:
        """Tensor-core instructions over the distinct GEMM kernels, by name."""
        total: Counter[str] = Counter()
        for gemm in {g.kernel: g for g in self.gemms}.values():
            total.update(gemm.instructions)
        return total

    def summary(self) -> dict[str, str]:
        """One line per fact: kernels, GEMM fusions, tiles, instructions, shared memory,
        threads and registers (ranges over the GEMM fusions)."""

        def span(values: Sequence[int], unit: str = "") -> str:
            if not values:
                return "none"
            low, high = min(values), max(values)
            return f"{low}{unit}" if low == high else f"{low}-{high}{unit}"

        configs = Counter(g.config for g in self.gemms)
        issued = Counter(g.issues for g in self.gemms)
        registers = [g.registers for g in self.gemms if g.registers is not None]
        distinct = len({g.kernel for g in self.gemms})
        return {
            "kernel launches in the program": str(self.kernels),
            "Triton GEMM fusions (distinct kernels)": f"{len(self.gemms)} ({distinct})",
            "tile configs (larger output side first)": "; ".join(
                f"{n} x {c}" for c, n in configs.most_common()
            ),
            "GEMM fusions issuing": ", ".join(f"{n} {k}" for k, n in issued.most_common()),
            "tensor-core instructions": ", ".join(sorted(self.instructions())),
            "shared memory per block": span([g.shared_memory for g in self.gemms], " B"),
            "threads per block": span([g.threads for g in self.gemms]),
            "registers per thread (ptxas)": span(registers),
        }


def ptxas_registers(report: str) -> dict[str, int]:
    """Kernel name -> registers per thread, from ``ptxas -v`` output."""
    found, entry = {}, None
    for line in report.splitlines():
        if m := _PTXAS_ENTRY.search(line):
            entry = m.group(1)
        elif (m := _PTXAS_REGISTERS.search(line)) and entry is not None:
            found[entry] = int(m.group(1))
            entry = None
    return found


@contextlib.contextmanager
def _observed_ptxas(folder: Path) -> Iterator[tuple[Path, Path]]:
    """A CUDA folder for XLA's ``xla_gpu_cuda_data_dir`` whose ``ptxas`` keeps a copy of each
    PTX file XLA hands it (in ``kept``), then runs the real one; yields (folder, kept)."""
    real = find_cuda_dir()
    if real is None:
        raise RuntimeError("ptxas was not found: install the kit's aot extra (make setup)")
    cuda, kept = folder / "cuda", folder / "ptx"
    (cuda / "bin").mkdir(parents=True)
    kept.mkdir()
    for entry in real.iterdir():
        if entry.name != "bin":
            (cuda / entry.name).symlink_to(entry)
    for tool in (real / "bin").iterdir():
        if tool.name != "ptxas":
            (cuda / "bin" / tool.name).symlink_to(tool)
    wrapper = cuda / "bin" / "ptxas"
    wrapper.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do\n'
        '  case "$a" in -*) ;; *) [ -f "$a" ] && cp "$a" '
        f'{shlex.quote(str(kept))}/"$(basename "$a")".ptx ;; esac\n'
        "done\n"
        f'exec {shlex.quote(str(real / "bin" / "ptxas"))} "$@"\n'
    )
    wrapper.chmod(0o755)
    yield cuda, kept


def _registers_of(kept: Path, names: set[str]) -> dict[str, int]:
    """Registers of the kernels ``names`` in the PTX files XLA handed ptxas (``ptxas -v``)."""
    real = find_cuda_dir()
    found: dict[str, int] = {}
    for ptx in sorted(kept.glob("*.ptx")):
        text = ptx.read_text(errors="replace")
        entries = set(re.findall(r"\.entry\s+(\w+)", text))
        target = re.search(r"^\.target\s+(\w+)", text, re.M)
        if real is None or target is None or not entries & names:
            continue
        run = subprocess.run(
            [
                str(real / "bin" / "ptxas"),
                "-v",
                f"-arch={target.group(1)}",
                str(ptx),
                "-o",
                os.devnull,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        found.update(ptxas_registers(run.stdout + run.stderr))
    return {k: v for k, v in found.items() if k in names}


def _devices(args: Sequence[PyTree]) -> list[jax.Device]:
    """The devices ``args`` are sharded over, by id (as the compile cache keys them)."""
    import jax

    found: set[jax.Device] = set()
    for leaf in jax.tree.leaves(args):
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None:
            found |= set(sharding.device_set)
    return sorted(found, key=lambda d: d.id)


def gemm_kernels(
    fn: Callable[..., PyTree],
    *args: PyTree,
    compiler_options: CompilerOptions | None = None,
    tiles: Tiles | None = None,
) -> KernelReport:
    """Compile ``fn(*args)`` deviceless and report each Triton GEMM kernel (module docstring).

    ``args`` are sharded on a compile-only GPU mesh; ``tiles`` as in
    :func:`labkit.xla.aot.compile_for_gpu`. The compile dumps XLA's Triton code and thunk
    sequence and points ``xla_gpu_cuda_data_dir`` at a folder whose ``ptxas`` keeps each PTX
    file it is handed; neither changes the program, so the compile is also stored in the
    kit's compile cache as the plain compile. The report is kept on disk under the compile's
    key (as :mod:`labkit.xla.compile_cache` keys compiles): a second run compiles nothing.
    """
    import jax

    chosen = gemm_tiles.default_tiles() if tiles is None else tiles
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    options = {k: v for k, v in (compiler_options or {}).items() if k != KERNEL_CACHE_OPTION}
    lowered, devices = jitted.lower(*args), _devices(args)
    plain = compile_cache.key(lowered, {**options, **gemm_tiles.cache_marker(chosen)}, devices)
    path = compile_cache.cache_folder() / "kernels" / f"{plain}.{REPORT_FORMAT}.json"
    if compile_cache.enabled() and path.exists():
        try:
            return _report_from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError):
            pass  # unreadable: compile again
    # No kernel cache file: XLA takes a cached kernel without dumping its code or calling
    # ptxas, so a GEMM kernel compiled before in this process would read empty.
    with tempfile.TemporaryDirectory(prefix="labkit-kernels-") as tmp:
        folder = Path(tmp)
        with _observed_ptxas(folder) as (cuda, kept):
            dumps = {
                **options,
                "xla_dump_to": str(folder / "dump"),
                "xla_gpu_dump_llvmir": True,
                "xla_dump_emitter_re": "triton",
                "xla_gpu_cuda_data_dir": str(cuda),
            }
            _no_symbolizer()
            result = compile_for_gpu(jitted, *args, compiler_options=dumps, tiles=chosen)
            report = _read_report(result, folder / "dump", kept)
    if compile_cache.enabled() and not isinstance(result.compiled, compile_cache.StoredCompile):
        compile_cache.store(plain, result.compiled, result.hlo, result.seconds)
        _store(path, report)
    return report


def _read_report(result: AotResult, dump: Path, kept: Path) -> KernelReport:
    sequences = sorted(dump.glob("*.thunk_sequence.txt"))
    metadata = sorted(dump.glob("*.thunk_metadata.txt"))
    if not sequences or not metadata:
        raise RuntimeError(f"XLA dumped no thunk sequence in {dump}: this jaxlib writes none")
    every = launches(sequences[-1].read_text(), metadata[-1].read_text())
    launched = {x.fusion: x for x in every}
    configs = gemm_tiles.compiled_configs(result.hlo)
    code = {
        p.name.split(".", 1)[1].removesuffix(".triton-to-llvm.txt"): p.read_text()
        for p in dump.glob("*.triton-to-llvm.txt")
    }
    missing = sorted(set(configs) - set(launched))
    if missing:
        raise RuntimeError(f"no launch in XLA's thunk sequence for {', '.join(missing[:3])}")
    kernels = {launched[f].kernel for f in configs}
    registers = _registers_of(kept, kernels)
    gemms = []
    for fusion, config in sorted(configs.items()):
        x = launched[fusion]
        found = dict(mma_instructions(code.get(x.kernel, "")))
        gemms.append(
            GemmKernel(
                fusion,
                x.kernel,
                _upright(config).describe(),
                found,
                x.shared_memory,
                x.threads,
                registers.get(x.kernel),
            )
        )
    return KernelReport(result.tiles, len(every), tuple(gemms))


def _upright(config: gemm_tiles.TileConfig) -> gemm_tiles.TileConfig:
    """The config with its larger output side first: compiled HLO gives the output tile in
    the fusion result's order, which a transposed result swaps."""
    sides = sorted((config.block_m, config.block_n), reverse=True)
    return dataclasses.replace(config, block_m=sides[0], block_n=sides[1])


def _report_from_json(data: Mapping[str, object]) -> KernelReport:
    gemms = tuple(GemmKernel(**g) for g in data["gemms"])  # type: ignore[attr-defined]
    return KernelReport(data["tiles"], int(data["kernels"]), gemms)  # type: ignore[arg-type, call-overload]


def _store(path: Path, report: KernelReport) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(dataclasses.asdict(report)))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def side_by_side(reports: Mapping[str, KernelReport]) -> list[dict[str, str]]:
    """Rows ``what, <name>, ...``: :meth:`KernelReport.summary` of each report, side by side."""
    summaries = {name: report.summary() for name, report in reports.items()}
    facts = next(iter(summaries.values()), {})
    return [{"what": fact, **{n: s[fact] for n, s in summaries.items()}} for fact in facts]
