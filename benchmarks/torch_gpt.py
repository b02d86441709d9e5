"""The kit's GPT written plainly in PyTorch, for the capstone's side-by-side benchmark.

Same architecture as ``labkit.gpt.model.GPT`` (pre-LayerNorm blocks, bias-free projections,
learned positions, untied head, GELU tanh approximation as ``jax.nn.gelu``'s default), same
AdamW (lr 3e-3, betas 0.9/0.95, weight decay 0.01), same batches. Run it with the PyTorch
environment (``.venv-torch/bin/python benchmarks/torch_gpt.py``); it prints one JSON line:

    {"tokens_per_s": [...], "step_s": [...], "loss": [...], "threads": 2, "torch": "2.14.1+cu130"}

Batches come from a JSON file of int lists written by the caller (``--batches``), or random
bytes if none is given. It imports no JAX, so nothing else shares its process or threads.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import time

import torch
from torch import nn
from torch.nn import functional as F


class Attention(nn.Module):
    """Causal multi-head self-attention with explicit matmuls (as the kit's einsums)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape  # (batch, seq, d_model)
        h = self.heads
        q = self.q(x).view(b, t, h, d // h).transpose(1, 2)  # (batch, heads, seq, head_dim)
        k = self.k(x).view(b, t, h, d // h).transpose(1, 2)  # (batch, heads, seq, head_dim)
        v = self.v(x).view(b, t, h, d // h).transpose(1, 2)  # (batch, heads, seq, head_dim)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // h)  # (batch, heads, seq, seq)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
        out = scores.softmax(-1) @ v  # (batch, heads, seq, head_dim)
        return self.o(out.transpose(1, 2).reshape(b, t, d))  # (batch, seq, d_model)


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, d: int, heads: int, d_ff: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.up, self.down = nn.Linear(d, d_ff, bias=False), nn.Linear(d_ff, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))  # (batch, seq, d_model)
        return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """Decoder-only transformer: embeddings, blocks, final norm, vocab head."""

    def __init__(self, vocab: int, seq: int, d: int, heads: int, layers: int, d_ff: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, d_ff) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.tok(tokens) + self.pos.weight[:t]  # (batch, seq, d_model)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # (batch, seq, vocab)


def main() -> None:
    """Train for ``--steps`` steps and print per-step times and losses as one JSON line."""
    p = argparse.ArgumentParser(description=__doc__)
    for name, default in [
        ("vocab", 256),
        ("seq", 128),
        ("d_model", 128),
        ("heads", 4),
        ("layers", 2),
        ("d_ff", 512),
        ("batch", 16),
        ("steps", 20),
        ("warmup", 3),
        ("threads", 0),
    ]:
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--batches", default="", help="JSON file: list of (batch, seq + 1) int lists")
    p.add_argument("--compile", action="store_true", help="wrap the step in torch.compile")
    p.add_argument(
        "--reuse-freed-memory",
        action="store_true",
        help="glibc keeps freed memory for reuse, as labkit.core.env.setup does for the kit",
    )
    args = p.parse_args()
    if args.reuse_freed_memory:  # the same two mallopt calls as labkit.core.env
        libc = ctypes.CDLL("libc.so.6")
        assert libc.mallopt(-4, 0) and libc.mallopt(-1, 2**31 - 1)  # M_MMAP_MAX, M_TRIM_THRESHOLD
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT(args.vocab, args.seq, args.d_model, args.heads, args.layers, args.d_ff)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)
    if args.batches:
        with open(args.batches) as f:
            data = [torch.tensor(b, dtype=torch.long) for b in json.load(f)]
    else:
        g = torch.Generator().manual_seed(0)
        data = [torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)]

    def step(batch: torch.Tensor) -> torch.Tensor:
        logits = model(batch[:, :-1])  # (batch, seq, vocab)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    run = torch.compile(step) if args.compile else step
    times, losses = [], []
    for i in range(args.warmup + args.steps):
        batch = data[i % len(data)]
        start = time.perf_counter()
        loss = float(run(batch))
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
            losses.append(loss)
    tokens = args.batch * args.seq
    print(
        json.dumps(
            {
                "tokens_per_s": [tokens / t for t in times],
                "step_s": times,
                "loss": losses,
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
