"""The capstone's performance bar: the kit's GPT train step against plain PyTorch, same config.

Both train GPTConfig.preset("small") (2 layers, d_model 128, 4 heads, vocab 256, seq 128)
with AdamW on batch 16 of the kit's corpus, on this machine's CPU. The kit's step is
``labkit.gpt.train.train_setup`` on one CPU device (pure ``jax.jit``, state donated; XLA:CPU's
intra-op threads use every core); a stateful ``nnx.jit`` step is timed too, for reference.
PyTorch runs ``benchmarks/torch_gpt.py`` in a subprocess of ``.venv-torch/bin/python``
(``make setup-torch``). The
runs alternate (kit, torch, kit, torch, ...) so load on the shared machine hits both alike;
the figures are medians over rounds. It prints; it asserts nothing (timings swing here).
The kit's ``setup()`` keeps freed memory for reuse (``labkit.core.env.reuse_freed_memory``);
PyTorch is timed both plain and with the same setting, and the kit is held to the better.

    .venv/bin/python benchmarks/capstone_bench.py [--rounds 3] [--steps 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[1]
TORCH_PY = ROOT / ".venv-torch" / "bin" / "python"
BATCH = 16


def kit_runner(steps: int, tokens: object) -> tuple:
    """Compile the kit's pure jit step on one CPU device; return ``run()`` -> step seconds."""
    import jax

    from labkit.core.mesh import make_mesh
    from labkit.gpt import data, train
    from labkit.gpt.config import GPTConfig

    cfg = GPTConfig.preset("small")
    mesh = make_mesh((1,), ("data",), devices=jax.devices()[:1])
    step, abstract_state, abstract_batch = train.train_setup(cfg, mesh, "dp", BATCH)
    compiled = step.lower(abstract_state, abstract_batch).compile()
    box = {"state": train.init_train_state(cfg, abstract_state)}
    batches = [
        jax.device_put(data.batch_at(tokens, i, BATCH, cfg.seq_len), abstract_batch.sharding)
        for i in range(steps)
    ]

    def run() -> list[float]:
        times = []
        for b in batches:
            start = time.perf_counter()
            box["state"], loss = compiled(box["state"], b)
            loss.block_until_ready()
            times.append(time.perf_counter() - start)
        return times

    run()  # warm-up
    return cfg, run, compiled


def nnx_runner(steps: int, tokens: object) -> object:
    """The stateful ``nnx.jit`` step (labkit.gpt.train.train_step) on one device."""
    import jax

    from labkit.gpt import data, train
    from labkit.gpt.config import GPTConfig

    cfg = GPTConfig.preset("small")
    model = train.create_model(cfg)
    opt = train.make_optimizer(model)
    batches = [
        jax.numpy.asarray(data.batch_at(tokens, i, BATCH, cfg.seq_len)) for i in range(steps)
    ]

    def run() -> list[float]:
        times = []
        for b in batches:
            start = time.perf_counter()
            train.train_step(model, opt, b).block_until_ready()
            times.append(time.perf_counter() - start)
        return times

    run()
    return run


def torch_run(steps: int, batch_file: str, reuse: bool = False) -> list[float]:
    """One PyTorch run in a subprocess: its per-step seconds after 3 warm-up steps."""
    out = subprocess.run(
        [
            str(TORCH_PY),
            str(ROOT / "benchmarks" / "torch_gpt.py"),
            "--steps",
            str(steps),
            "--batch",
            str(BATCH),
            "--batches",
            batch_file,
            *(["--reuse-freed-memory"] if reuse else []),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["step_s"]


def main() -> None:
    """Alternate kit and PyTorch runs; print tokens/s, the ratio and model FLOP/s vs peak."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=15)
    args = p.parse_args()
    if not TORCH_PY.exists():
        sys.exit(f"{TORCH_PY} is missing: build PyTorch's environment with `make setup-torch`")
    from labkit.core.env import setup

    setup(cpu_devices=1, mode="cpu")
    import jax

    from labkit.core.timing import matmul_roofline
    from labkit.gpt import data
    from labkit.gpt.config import flops_per_token
    from labkit.xla.cost import compiled_flops

    tokens = data.encode(data.corpus(200_000))
    cfg, kit, compiled = kit_runner(args.steps, tokens)
    nnx_run = nnx_runner(args.steps, tokens)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(
            [data.batch_at(tokens, i, BATCH, cfg.seq_len).tolist() for i in range(args.steps)], f
        )
    kit_s, torch_s, torch_r, nnx_s = [], [], [], []
    for r in range(args.rounds):
        kit_s.append(statistics.median(kit()))
        torch_s.append(statistics.median(torch_run(args.steps, f.name)))
        torch_r.append(statistics.median(torch_run(args.steps, f.name, reuse=True)))
        nnx_s.append(statistics.median(nnx_run()))
        print(
            f"round {r}: kit {kit_s[-1] * 1e3:.1f} ms/step, torch {torch_s[-1] * 1e3:.1f} "
            f"(reusing freed memory {torch_r[-1] * 1e3:.1f}), nnx.jit {nnx_s[-1] * 1e3:.1f}",
            flush=True,
        )
    os.unlink(f.name)
    tok = BATCH * cfg.seq_len
    kit_t, nnx_t = (tok / statistics.median(s) for s in (kit_s, nnx_s))
    torch_plain, torch_reuse = (tok / statistics.median(s) for s in (torch_s, torch_r))
    torch_t = max(torch_plain, torch_reuse)  # the kit is held to PyTorch's better figure
    peak = max(p.tflops for p in matmul_roofline((256, 512, 1024), ("float32",), repeats=3))
    model_flops = flops_per_token(cfg) * tok
    xla_flops = compiled_flops(compiled)
    print(
        f"\njax {jax.__version__}, {os.cpu_count()} CPUs, config small, batch {BATCH}, "
        f"{args.rounds} rounds x {args.steps} steps (medians)"
    )
    print(f"kit jit step (1 device) : {kit_t:9.0f} tokens/s")
    print(f"kit nnx.jit step        : {nnx_t:9.0f} tokens/s")
    print(f"PyTorch (plain, eager)  : {torch_plain:9.0f} tokens/s")
    print(f"  same, freed memory kept: {torch_reuse:9.0f} tokens/s (the kit's setup() does this)")
    print(
        f"ratio kit / PyTorch     : {kit_t / torch_t:9.2f}x  (nnx.jit: {nnx_t / torch_t:.2f}x; "
        "against the better PyTorch figure)"
    )
    for name, fl in (("6ND + attention", model_flops), ("XLA cost analysis", xla_flops)):
        rate = fl * kit_t / tok
        print(
            f"model FLOP/s ({name:17s}): {rate / 1e9:7.2f} GFLOP/s = "
            f"{rate / (peak * 1e12):.0%} of the measured f32 matmul peak {peak * 1e3:.1f} GFLOP/s"
        )


if __name__ == "__main__":
    main()
