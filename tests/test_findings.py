"""labkit.xla.findings: split-K GEMMs, pack/unpack around combined all-reduces, what to try."""

from __future__ import annotations

import dataclasses

import pytest
from hlo_programs import HEADER

from labkit.core.hardware import hardware
from labkit.xla import findings, predict

# A split-K GEMM as XLA writes it: K = 256 cut into 4 x 64, the dot batched over the 4 slices
# (the batch dimension just before each operand's contracting one), f32 partials summed by a
# reduce over their leading dimension; then an attention-like product with the same dot shape
# whose batch nothing sums.
SPLIT_K = (
    HEADER
    + """
%gemm (l: f32[32,4,64], r: f32[4,64,16]) -> f32[4,32,16] {
  %l = f32[32,4,64]{2,1,0} parameter(0)
  %r = f32[4,64,16]{2,1,0} parameter(1)
  ROOT %dk = f32[4,32,16]{2,1,0} dot(%l, %r), lhs_batch_dims={1}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
}

%sum (s: f32[4,32,16]) -> f32[32,16] {
  %s = f32[4,32,16]{2,1,0} parameter(0)
  %z = f32[] constant(0)
  ROOT %red = f32[32,16]{1,0} reduce(%s, %z), dimensions={0}, to_apply=%add
}

%attn (q: f32[4,32,64], k: f32[4,64,16]) -> f32[4,32,16] {
  %q = f32[4,32,64]{2,1,0} parameter(0)
  %k = f32[4,64,16]{2,1,0} parameter(1)
  ROOT %da = f32[4,32,16]{2,1,0} dot(%q, %k), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
}

ENTRY %main (a: f32[32,4,64], b: f32[4,64,16], c: f32[4,32,64]) -> (f32[32,16], f32[4,32,16]) {
  %a = f32[32,4,64]{2,1,0} parameter(0)
  %b = f32[4,64,16]{2,1,0} parameter(1)
  %c = f32[4,32,64]{2,1,0} parameter(2)
  %g = f32[4,32,16]{2,1,0} fusion(%a, %b), kind=kCustom, calls=%gemm, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
  %s = f32[32,16]{1,0} fusion(%g), kind=kInput, calls=%sum
  %h = f32[4,32,16]{2,1,0} fusion(%c, %b), kind=kCustom, calls=%attn, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
  ROOT %t = (f32[32,16]{1,0}, f32[4,32,16]{2,1,0}) tuple(%s, %h)
}
"""  # noqa: E501
)

# Two gradients combined into one all-reduce: packed by a concatenate, unpacked by slices.
COMBINED = (
    HEADER
    + """
%pack (x: f32[64], y: f32[64]) -> f32[128] {
  %x = f32[64]{0} parameter(0)
  %y = f32[64]{0} parameter(1)
  ROOT %cat = f32[128]{0} concatenate(%x, %y), dimensions={0}
}

%first (p: f32[128]) -> f32[64] {
  %p = f32[128]{0} parameter(0)
  ROOT %s1 = f32[64]{0} slice(%p), slice={[0:64]}
}

%second (q: f32[128]) -> f32[64] {
  %q = f32[128]{0} parameter(0)
  ROOT %s2 = f32[64]{0} slice(%q), slice={[64:128]}
}

ENTRY %main (a: f32[64], b: f32[64]) -> (f32[64], f32[64]) {
  %a = f32[64]{0} parameter(0)
  %b = f32[64]{0} parameter(1)
  %packed = f32[128]{0} fusion(%a, %b), kind=kLoop, calls=%pack
  %ars = ((f32[128]{0}), f32[128]{0}) all-reduce-start(%packed), replica_groups={}, to_apply=%add
  %ard = f32[128]{0} all-reduce-done(%ars)
  %u1 = f32[64]{0} fusion(%ard), kind=kLoop, calls=%first
  %u2 = f32[64]{0} fusion(%ard), kind=kLoop, calls=%second
  ROOT %t = (f32[64]{0}, f32[64]{0}) tuple(%u1, %u2)
}
"""
)


def test_split_k_is_named_and_attention_is_not() -> None:
    (found,) = findings.split_k(SPLIT_K)
    assert (found.dot, found.kernel, found.splits, found.k) == ("dk", "g", 4, 256)
    assert found.partial_bytes == 4 * 32 * 16 * 4  # f32 partials written per call


def test_pack_and_unpack_priced_against_the_memory_term() -> None:
    (pu,) = findings.pack_and_unpack(COMBINED)
    assert (pu.collective, pu.pack, pu.unpack) == ("ars", ("packed",), ("u1", "u2"))
    hbm = hardware("H100 SXM").hbm_gbps * 1e9
    moved = (256 + 256 + 512) + 2 * (256 + 256)  # pack reads both, writes all; slices 1/2 each
    assert pu.memory_us == pytest.approx(moved / hbm * 1e6)
    assert pu.floor_us == pytest.approx(3.0)  # three kernels at the 1 us floor
    memory_s = predict.predict(COMBINED).memory_s  # the only kernels: all of the memory term
    assert pu.share_of_memory == pytest.approx(pu.memory_us / (memory_s * 1e6)) == 1.0
    assert findings.pack_and_unpack(SPLIT_K) == []  # no all-reduce, nothing combined


def test_what_to_try_names_the_dominant_term() -> None:
    base = dataclasses.replace(predict.predict(COMBINED), exposed_s=0.0)  # floors alone
    floors = findings.what_to_try(base)
    assert len(floors) == 1 and floors[0].startswith("kernel floors dominate")
    memory = findings.what_to_try(dataclasses.replace(base, memory_s=10 * base.floor_s))
    assert len(memory) == 1 and "--xla_gpu_all_reduce_combine_threshold_bytes" in memory[0]
    both = dataclasses.replace(base, exposed_s=0.8 * base.floor_s)  # within half: both named
    assert [t.split(" dominate")[0] for t in findings.what_to_try(both)] == [
        "kernel floors",
        "exposed communication",
    ]
