"""NCCL's own time model of an all-reduce inside one NVLink node: a ring, or NVLS.

NCCL picks an algorithm and a protocol per call from a model of each one's time,
``latency + bytes / algorithm bandwidth`` (NVIDIA/nccl ``src/graph/tuning.cc``,
``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``). This module follows that model for one
node, the Simple protocol (the one NVLS has, and the ring's for large buffers):

- **ring**: latency ``8.4 us + 2(n-1) x 3.4 us`` (its base latency plus one NVLink hop per
  step); bus bandwidth = the node's NVLink bandwidth; algorithm bandwidth = bus bandwidth
  x ``n / (2(n-1))``. So each GPU puts ``2(n-1)/n x B`` on its links, the kit's ring formula.
- **NVLS** (NVLink SHARP: the NVSwitch reduces and multicasts, on NVSwitch systems such as an
  8-GPU HGX H100; ``NCCL_NVLS_ENABLE``): latency 25 us; bus bandwidth = ``2 x efficiency x
  (c-1)/c x`` the NVLink bandwidth, where "AllReduce pipelines two operations" gives the 2,
  the efficiency is 0.85 on Hopper (0.74 on Blackwell) and ``c`` NVLS channels (16 on sm_90,
  ``src/transport/nvls.cc``); the same ``n / (2(n-1))`` conversion. NCCL models time, not
  traffic: at the ring's bandwidth that time would carry ``(n-1)/n x B`` per GPU, half a
  ring's bytes (the *ring-equivalent* bytes), at 85% efficiency. What an NVLS GPU really
  puts on the wire is its whole buffer ``B`` into the switch (and the sum back).

The node's NVLink bandwidth is NCCL's own figure: 20.6 GB/s per NVLink on sm_90, 40.1 on sm_100
(``src/graph/topo.h``), times the GPU's links (18 on an H100 SXM or a B200), one direction.
NCCL's graph search may find less; its LL and LL128 protocols (lower latency, lower
bandwidth) win for small buffers and are left out here. A model, like the kit's, not a
measurement.
"""

from __future__ import annotations

import dataclasses

__all__ = ["ALGORITHMS", "ARCHES", "NcclArch", "NcclTime", "all_reduce"]


@dataclasses.dataclass(frozen=True)
class NcclArch:
    """The constants of NCCL's tuner for one GPU generation (see the module docstring)."""

    nvlink_gbps: float  # NCCL's bandwidth of one NVLink, one direction
    links: int  # NVLinks per GPU
    nvls_efficiency: float
    nvls_channels: int

    @property
    def node_gbps(self) -> float:
        """The node's NVLink bandwidth per GPU, one direction, as NCCL's tuner counts it."""
        return self.nvlink_gbps * self.links


ARCHES: dict[str, NcclArch] = {
    "sm_90": NcclArch(20.6, 18, 0.85, 16),  # H100 / H200 SXM
    "sm_100": NcclArch(40.1, 18, 0.74, 24),  # B200, one node
}
ALGORITHMS = ("ring", "nvls")
RING_BASE_US, RING_HOP_US, NVLS_US = 8.4, 3.4, 25.0  # Simple protocol, NVLink


@dataclasses.dataclass(frozen=True)
class NcclTime:
    """One all-reduce by NCCL's model: microseconds, and the bytes each GPU puts on the wire."""

    algorithm: str
    latency_us: float
    bus_gbps: float
    wire_bytes: float  # per GPU, one direction
    us: float


def all_reduce(nbytes: float, n: int, algorithm: str = "ring", arch: str = "sm_90") -> NcclTime:
    """NCCL's modelled time of an all-reduce of ``nbytes`` over ``n`` GPUs of one node."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    if arch not in ARCHES:
        raise ValueError(f"arch must be one of {', '.join(ARCHES)}, got {arch!r}")
    if n < 2:
        raise ValueError(f"an all-reduce over {n} GPU(s) moves nothing: use n >= 2")
    a = ARCHES[arch]
    if algorithm == "ring":
        latency, bus = RING_BASE_US + 2 * (n - 1) * RING_HOP_US, a.node_gbps
    else:
        channels = a.nvls_channels
        latency = NVLS_US
        bus = 2 * a.nvls_efficiency * (channels - 1) / channels * a.node_gbps
    algorithm_gbps = bus * n / (2 * (n - 1))
    wire = 2 * (n - 1) / n * nbytes / (2 if algorithm == "nvls" else 1)
    return NcclTime(algorithm, latency, bus, wire, latency + nbytes / (algorithm_gbps * 1e3))
