"""labkit.core.nccl_model: NCCL's tuner model of a one-node all-reduce, ring and NVLS."""

from __future__ import annotations

import pytest

from labkit.core import nccl_model


def test_ring_on_eight_h100s_worked_by_hand() -> None:
    """64 MiB over 8 GPUs: 8.4 + 14 x 3.4 = 56 us, then B / (18 x 20.6 GB/s x 8/14)."""
    t = nccl_model.all_reduce(2**26, 8, "ring")
    assert t.latency_us == pytest.approx(56.0)
    assert t.bus_gbps == pytest.approx(370.8)
    assert t.us == pytest.approx(56.0 + 2**26 / (370.8 * 8 / 14 * 1e3))
    assert t.wire_bytes == pytest.approx(1.75 * 2**26)  # the ring's 2(n-1)/n


def test_nvls_sends_half_a_ring_at_85_percent() -> None:
    """NVLS: 25 us, bus bandwidth 2 x 0.85 x 15/16 x 370.8 GB/s; half the ring's wire bytes."""
    ring, nvls = (nccl_model.all_reduce(2**26, 8, a) for a in ("ring", "nvls"))
    assert nvls.latency_us == 25.0
    assert nvls.bus_gbps == pytest.approx(2 * 0.85 * 15 / 16 * 370.8)
    assert nvls.wire_bytes == pytest.approx(ring.wire_bytes / 2)
    assert nvls.us == pytest.approx(25.0 + 2**26 / (2 * 0.85 * 15 / 16 * 370.8 * 8 / 14 * 1e3))
    assert nvls.us < ring.us  # 224 us against 373 us
    b200 = nccl_model.all_reduce(2**26, 8, "nvls", "sm_100")
    assert b200.bus_gbps == pytest.approx(2 * 0.74 * 23 / 24 * 18 * 40.1)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((1.0, 8, "tree"), "algorithm must be"),
        ((1.0, 8, "ring", "sm_80"), "arch must"),
        ((1.0, 1), "n >= 2"),
    ],
)
def test_errors_say_what_to_pass(args: tuple, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        nccl_model.all_reduce(*args)
