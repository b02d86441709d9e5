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
  ``tcgen05.mma`` (Blackwell, tensor memory), with shapes and operand types.

Nothing here runs a kernel. Dumps go to temporary folders that are removed on return.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from labkit.core.types import CompilerOptions, PyTree
from labkit.xla.aot import AotResult, compile_for_gpu
from labkit.xla.tiles import Tiles

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
def _fd1_to(path: Path) -> Iterator[None]:
    """Send file descriptor 1 (where C++ code prints) to ``path`` for the duration."""
    sys.stdout.flush()
    saved = os.dup(1)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(target, 1)
    os.close(target)
    try:
        yield
    finally:
        os.dup2(saved, 1)
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
        with _environment(MOSAIC_DUMP_ENV), _fd1_to(log):
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
