"""00_welcome: the exercise checkers of the welcome notebook."""

from __future__ import annotations

from labkit.core.feedback import Feedback, check_integer, check_number
from labkit.core.hardware import ridge_intensity
from labkit.xla import hlo
from labkit.xla.cost import kernel_flops
from labkit.xla.hlo_text import parse_module


def entry_collectives(compiled_hlo: str) -> list[dict[str, str | int]]:
    """The entry computation's collectives in schedule order: kind, bytes, async or sync, and
    how many matmul kernels (dots, GEMM fusions or cuBLAS calls) run before and after each."""
    module = parse_module(compiled_hlo)
    entry = module.computations[module.entry]
    matmuls = [i.index for i in entry if sum(kernel_flops(module, i).values()) > 0]
    index = {i.name: i.index for i in entry}
    return [
        {
            "kind": c.kind,
            "bytes": c.bytes,
            "mode": "async" if c.is_async else "sync",
            "matmuls_before": sum(m < index[c.name] for m in matmuls),
            "matmuls_after": sum(m > index[c.name] for m in matmuls),
        }
        for c in hlo.collectives(compiled_hlo)
        if c.name in index
    ]


def check_ridge_matmul_size(answer: object, gpu: str = "H100 SXM") -> Feedback:
    """00.1: smallest square bf16 matmul size n that is compute-bound on ``gpu``.

    A bf16 n x n matmul does 2 n^3 FLOPs and moves at least 3 n^2 * 2 bytes, so its
    intensity is n / 3 FLOP/byte; it is compute-bound once n / 3 reaches the ridge.
    """
    expected = 3 * ridge_intensity(gpu)
    return check_number(
        "00.1",
        answer,
        expected,
        0.05,
        "intensity of a bf16 n x n matmul is 2n^3 / (3 * 2 n^2) = n/3 FLOP/byte; "
        "set it equal to peak FLOP/s / bandwidth from labkit.core.hardware.hardware(...)",
    )


def check_all_reduce_count(answer: object, compiled_hlo: str) -> Feedback:
    """00.2: how many all-reduce collectives (async pairs counted once) the HLO has."""
    expected = sum(c.kind == "all-reduce" for c in hlo.collectives(compiled_hlo))
    return check_integer(
        "00.2",
        answer,
        expected,
        f"{expected} all-reduce(s): one per combined gradient group.",
        "count lines whose op is all-reduce or all-reduce-start (a -done line ends the same "
        "collective); labkit.xla.hlo.collectives(hlo) does this",
    )
