"""02b_export_pytorch: the kit's GPT block in PyTorch, to StableHLO with torch.export + torchax.

PyTorch is imported lazily, inside the functions that need it: this module (its checkers
above all) imports in the lab's main environment, which has no torch. The notebook runs in
``.venv-torch`` (kernel ``labkit-torch``), where torch 2.14 and torchax are installed.

The PyTorch modules mirror :mod:`labkit.gpt.model` (pre-LayerNorm, no biases in the
projections, causal softmax attention, tanh GELU, LayerNorm epsilon 1e-6) and take their
weights from a JAX block, so both frameworks compute the same layer.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.typing import ArrayLike

from labkit.core.env import scratch_dir
from labkit.core.feedback import (
    Caught,
    Feedback,
    check_integer,
    expect_error,
    first_line,
    judge,
    unanswered,
)
from labkit.gpt.config import GPTConfig
from labkit.gpt.model import MLP, Block
from labkit.xla.hlo import instructions, kernel_counts, op_histogram


def kit_block(cfg: GPTConfig, seed: int = 0) -> Block:
    """The kit's JAX transformer block (:class:`labkit.gpt.model.Block`), unsharded."""
    with nnx.use_eager_sharding(False):
        return Block(cfg, nnx.Rngs(seed))


def jax_stablehlo(module: nnx.Module, x: ArrayLike) -> str:
    """StableHLO text of an NNX module's forward pass on ``x`` (params as inputs)."""
    graphdef, state = nnx.split(module)
    forward = jax.jit(lambda s, a: nnx.merge(graphdef, s)(a))
    return str(forward.lower(state, x).as_text())


def jax_forward(module: nnx.Module, x: ArrayLike) -> np.ndarray:
    """The NNX module's output on ``x`` as a numpy array (jitted: one compile, not one per op)."""
    graphdef, state = nnx.split(module)
    return np.asarray(jax.jit(lambda s, a: nnx.merge(graphdef, s)(a))(state, jnp.asarray(x)))


def torch_classes() -> dict[str, type]:
    """PyTorch twins of the kit's ``MLP``, ``Attention``, ``Block``, and ``KeepPositive``."""
    import torch
    from torch import nn
    from torch.nn import functional

    class TorchMLP(nn.Module):
        """d_model -> d_ff -> tanh GELU -> d_model, no biases (like the kit's MLP)."""

        def __init__(self, d_model: int, d_ff: int) -> None:
            super().__init__()
            self.up = nn.Linear(d_model, d_ff, bias=False)
            self.down = nn.Linear(d_ff, d_model, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(functional.gelu(self.up(x), approximate="tanh"))  # (b, t, d)

    class TorchAttention(nn.Module):
        """Causal multi-head self-attention with explicit matmuls (like the kit's)."""

        def __init__(self, d_model: int, num_heads: int) -> None:
            super().__init__()
            self.num_heads = num_heads
            self.q, self.k, self.v, self.o = (
                nn.Linear(d_model, d_model, bias=False) for _ in range(4)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape  # (batch, seq, d_model)
            h = self.num_heads
            q, k, v = (
                p(x).view(b, t, h, d // h).transpose(1, 2) for p in (self.q, self.k, self.v)
            )  # (b, h, t, d/h)
            scores = q @ k.transpose(-2, -1) / math.sqrt(d // h)  # (b, h, t, t)
            causal = torch.ones(t, t, dtype=torch.bool).tril()  # (t, t)
            scores = scores.masked_fill(~causal, torch.finfo(torch.float32).min)
            out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)  # (b, t, d)
            return self.o(out)  # (batch, seq, d_model)

    class TorchBlock(nn.Module):
        """Pre-LayerNorm block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

        def __init__(self, d_model: int, num_heads: int, d_ff: int) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(d_model, eps=1e-6)  # flax's default epsilon
            self.attn = TorchAttention(d_model, num_heads)
            self.ln2 = nn.LayerNorm(d_model, eps=1e-6)
            self.mlp = TorchMLP(d_model, d_ff)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln1(x))  # (batch, seq, d_model)
            return x + self.mlp(self.ln2(x))  # (batch, seq, d_model)

    class KeepPositive(nn.Module):
        """The rows of ``x`` whose sum is positive: an output shape that depends on the data."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[x.sum(-1) > 0]  # (rows kept, d)

    return {
        "MLP": TorchMLP,
        "Attention": TorchAttention,
        "Block": TorchBlock,
        "KeepPositive": KeepPositive,
    }


def _copy_linear(dst: Any, kernel: nnx.Param[jax.Array]) -> None:  # dst: an nn.Linear
    import torch

    # flax stores (d_in, d_out) and computes x @ kernel; nn.Linear stores (d_out, d_in), x @ W.T
    dst.weight.data = torch.from_numpy(np.array(kernel[...], np.float32).T.copy())


def torch_mlp_from(mlp: MLP, cfg: GPTConfig) -> Any:
    """A PyTorch MLP (eval mode) holding the weights of the kit's JAX ``mlp``."""
    out = torch_classes()["MLP"](cfg.d_model, cfg.d_ff).eval()
    _copy_linear(out.up, mlp.up.kernel)
    _copy_linear(out.down, mlp.down.kernel)
    return out


def torch_block_from(block: Block, cfg: GPTConfig) -> Any:
    """A PyTorch block (eval mode) holding the weights of the kit's JAX ``block``."""
    import torch

    out = torch_classes()["Block"](cfg.d_model, cfg.num_heads, cfg.d_ff).eval()
    for name in ("q", "k", "v", "o"):
        _copy_linear(getattr(out.attn, name), getattr(block.attn, name).kernel)
    norms: list[tuple[Any, Any]] = [(out.ln1, block.ln1), (out.ln2, block.ln2)]
    for ln, src in norms:
        ln.weight.data = torch.from_numpy(np.array(src.scale[...], np.float32))
        ln.bias.data = torch.from_numpy(np.array(src.bias[...], np.float32))
    out.mlp.load_state_dict(torch_mlp_from(block.mlp, cfg).state_dict())
    return out


def torch_forward(module: Any, x: ArrayLike) -> np.ndarray:
    """The PyTorch module's output on ``x`` (numpy in, numpy out), without autograd."""
    import torch

    with torch.no_grad():
        return module(torch.from_numpy(np.asarray(x, np.float32))).numpy()


def torch_export(module: Any, x: ArrayLike, batch: Any = None) -> Any:
    """``torch.export.export(module, (x,))``; ``batch``: a ``torch.export.Dim`` for axis 0.

    torch.export makes TorchInductor's cache folder, ``$TMPDIR/torchinductor_<user>`` unless
    ``TORCHINDUCTOR_CACHE_DIR`` names one, and leaves it: here it is a folder removed at exit.
    """
    import torch

    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(scratch_dir("labkit-torchinductor-"))
    shapes = {"x": {0: batch}} if batch is not None else None
    return torch.export.export(
        module, (torch.from_numpy(np.asarray(x, np.float32)),), dynamic_shapes=shapes
    )


def expect_error_line(
    *types: type[BaseException], match: str | None = None
) -> contextlib.AbstractContextManager[Caught]:
    """:func:`labkit.core.feedback.expect_error`, printing only the first line of the error.

    An error raised inside torch.export's interpreter ends with torch.fx's dump of the node
    that failed and a pointer to ``tlparse``; the first line says what went wrong (the whole
    message stays in the yielded ``Caught``).
    """
    return expect_error(*types, match=match, shown=first_line)


def aten_ops(program: Any) -> Counter[str]:
    """The ATen ops of a ``torch.export.ExportedProgram`` graph, by name."""
    return Counter(str(node.target) for node in program.graph.nodes if node.op == "call_function")


def to_stablehlo(program: Any) -> tuple[list[jax.Array], jax.export.Exported]:
    """``(weights, Exported)`` by torchax: StableHLO for the CPU, called ``exp.call(w, ([x],))``."""
    import torchax.export

    return torchax.export.exported_program_to_stablehlo(program)


def export_for(
    program: Any, platforms: Sequence[str]
) -> tuple[list[jax.Array], jax.export.Exported]:
    """Like :func:`to_stablehlo`, lowered for ``platforms`` (e.g. ``("cpu", "cuda")``).

    torchax's ``exported_program_to_stablehlo`` calls ``jax.export`` without ``platforms``
    (so: the default backend, the CPU here). Its two halves are public: the JAX function that
    interprets the PyTorch graph, and the input types (symbolic dimensions included).
    """
    import torchax.export

    weights, fn = torchax.export.exported_program_to_jax(program)
    avals = torchax.export.extract_avals(program)
    exported = jax.export.export(jax.jit(fn), platforms=tuple(platforms))(weights, (avals,))
    return weights, exported


def call(exported: jax.export.Exported, weights: Sequence[jax.Array], x: ArrayLike) -> np.ndarray:
    """Run a torchax export on ``x`` in JAX (its one output, as numpy)."""
    (out,) = exported.call(weights, ([jnp.asarray(x)],))
    return np.asarray(out)


_LOC = re.compile(r"\s+loc\((?:[^()]|\([^()]*\))*\)")


def function_text(stablehlo: str, name: str = "main", width: int = 120) -> str:
    """One function of StableHLO text, without debug locations, lines cut at ``width``."""
    lines = stablehlo.splitlines()
    start = next(i for i, x in enumerate(lines) if f"@{name}(" in x and "func.func" in x)
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith(" " * indent + "}"))
    body = [_LOC.sub("", x)[indent:] for x in lines[start : end + 1]]
    return "\n".join(x if len(x) <= width else x[: width - 4] + " ..." for x in body)


def compare_ops(torch_text: str, jax_text: str, top: int = 14) -> list[dict[str, str | int]]:
    """Rows ``op, PyTorch, JAX`` for the ops of both StableHLO texts, most frequent first."""
    a, b = op_histogram(torch_text), op_histogram(jax_text)
    names = sorted(set(a) | set(b), key=lambda op: (-(a[op] + b[op]), op))
    return [{"op": op, "PyTorch": a[op], "JAX": b[op]} for op in names[:top]]


def h100_kernels(hlo: str) -> list[dict[str, str | int]]:
    """Rows ``kernel, count`` of :func:`labkit.xla.hlo.kernel_counts`: fusions, custom calls."""
    counts = kernel_counts(hlo)
    fusion_kinds = sorted(k for k in counts if k.startswith("k"))  # kLoop, kCustom:..., ...
    calls = sorted(k for k in counts if not k.startswith("k"))  # custom-call targets
    rows: list[dict[str, str | int]] = [
        {"kernel": f"fusion {k}", "count": counts[k]} for k in fusion_kinds
    ]
    return rows + [{"kernel": f"custom-call {k}", "count": counts[k]} for k in calls]


def gemm_widths(hlo: str) -> list[int]:
    """The last result dimension of each top-level Triton GEMM fusion, in program order."""
    widths = []
    for inst in instructions(hlo):
        config = inst.backend_config().get("fusion_backend_config", {})
        if inst.is_entry and config.get("kind") == "__triton_nested_gemm_fusion":
            widths.append(int(inst.shape.split("]")[0].split(",")[-1]))
    return widths


def transposes(hlo: str) -> list[str]:
    """The result shapes of every ``transpose`` in compiled HLO (inside fusions too)."""
    return [inst.shape.split("{")[0] for inst in instructions(hlo) if inst.opcode == "transpose"]


# ---------------------------------------------------------------------------------------
# Checkers (no torch needed)


def _names(answer: Any) -> set[str] | None:
    if isinstance(answer, str):
        return {answer}
    try:
        return {str(x) for x in answer}
    except TypeError:
        return None


def check_torch_only_ops(answer: object, torch_text: str, jax_text: str) -> Feedback:
    """02b.1: the op names in PyTorch's StableHLO of the block that JAX's does not have."""
    if unanswered(answer):
        return judge("02b.1", answer, False, "", "")
    expected = set(op_histogram(torch_text)) - set(op_histogram(jax_text))
    got = _names(answer)
    if got is None:
        return Feedback("02b.1", False, True, "give a set of op names, e.g. {'stablehlo.add'}")
    missing, extra = sorted(expected - got), sorted(got - expected)
    return judge(
        "02b.1",
        answer,
        got == expected,
        f"right: {sorted(expected)}. and/not build PyTorch's boolean mask (a tril of ones, "
        "then ~causal); convert comes from torchax's helpers for var and where, which cast "
        "scalars. JAX builds its mask with one compare and selects directly.",
        f"missing {missing}, not in the difference {extra}: compare the keys of "
        "op_histogram(torch_text) and op_histogram(jax_text) as sets",
    )


def check_batch_bound(answer: object, max_batch: int = 64) -> Feedback:
    """02b.2: an Exported (from torchax) whose batch is symbolic with at most ``max_batch``."""
    if unanswered(answer):
        return judge("02b.2", answer, False, "", "")
    avals = getattr(answer, "in_avals", None)
    if not avals:
        return Feedback(
            "02b.2",
            False,
            True,
            "pass the Exported that to_stablehlo(program) returned (its second "
            f"item), got {type(answer).__name__}",
        )
    batch = avals[-1].shape[0]  # the user input comes after the weights
    if not jax.export.is_symbolic_dim(batch):
        return Feedback(
            "02b.2",
            False,
            True,
            f"the batch is the constant {batch}: give torch_export a torch.export.Dim for it",
        )
    lo, hi = jax.export.symbolic_dim_bounds(batch)
    return judge(
        "02b.2",
        answer,
        hi == max_batch,
        f"right: JAX proves {batch} in [{lo}, {hi}] and the module checks it at run time.",
        f"JAX proves the batch {batch} in [{lo}, {hi}]; give the Dim max={max_batch}",
    )


def cublas_program(
    exported: jax.export.Exported, weights: Sequence[Any], x: jax.ShapeDtypeStruct
) -> str:
    """Optimized HLO of a torchax export (``exported.call(weights, ([x],))``) compiled for the
    GPUs ``x``'s sharding lives on, in the kit's cuBLAS variant
    (:data:`labkit.gpt.compile.CUBLAS`: cuBLAS GEMMs instead of Triton GEMM fusions); the
    weights are replicated."""
    from labkit.core.mesh import abstract
    from labkit.gpt.compile import CUBLAS
    from labkit.xla import aot

    mesh = x.sharding.mesh
    args = (abstract(list(weights), mesh), ([x],))
    return aot.compile_for_gpu(exported.call, *args, compiler_options=CUBLAS).hlo


def check_kernel_count(
    answer: object, exported: jax.export.Exported, weights: Sequence[Any], x: jax.ShapeDtypeStruct
) -> Feedback:
    """02b.3: how many kernels the block's H100 program launches (top-level fusions and custom
    calls) in the cuBLAS variant; the checker compiles it (:func:`cublas_program`)."""
    if unanswered(answer):
        return judge("02b.3", answer, False, "", "")
    counts = kernel_counts(cublas_program(exported, weights, x))
    expected = sum(counts.values())
    calls = sum(n for kind, n in counts.items() if not kind.startswith("k"))
    return check_integer(
        "02b.3",
        answer,
        expected,
        f"{expected}: every top-level fusion is one kernel launch, and so is each custom call "
        f"(here {calls} cuBLAS GEMMs); parameters, bitcasts and tuples launch nothing. "
        "Compare with the default program's table in section 7.",
        "compile it with aot.compile_for_gpu(dyn_exp.call, abstract(dyn_weights, h100), "
        "([x_h100],), compiler_options=CUBLAS), then add its top-level fusions and custom "
        "calls: sum(labkit.xla.hlo.kernel_counts(hlo).values())",
    )


def check_gemm_kernels(answer: object, gpu_hlo: str) -> Feedback:
    """02b.p1 (predict): GEMM kernels of the block's H100 program (for its 8 matmuls)."""
    expected = sum(n for kind, n in kernel_counts(gpu_hlo).items() if "gemm" in kind)
    return check_integer(
        "02b.p1",
        answer,
        expected,
        f"{expected} GEMM kernels for 8 matmuls; the next cells say which merged.",
        f"XLA launched {expected}: which matmuls read the same input?",
    )
