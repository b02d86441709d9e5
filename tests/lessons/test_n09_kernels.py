"""labkit.lessons.n09_kernels: the checkers (right passes, wrong fails, unanswered is to do)."""

from __future__ import annotations

import pytest

from labkit.gpt.config import GPTConfig
from labkit.lessons import n09_kernels as n09

TRITON_HLO = """\
HloModule m, is_scheduled=true

ENTRY %main (p: bf16[8]) -> bf16[8] {
  %p = bf16[8]{0} parameter(0)
  ROOT %t = bf16[8]{0} custom-call(%p), custom_call_target="__gpu$xla.gpu.triton"
}
"""


def test_largest_fitting_block_k() -> None:
    assert n09.largest_fitting_block_k(1024, 256, 256, 2) == 64
    assert n09.largest_fitting_block_k(1024, 64, 64, 2) == 256  # 3 x 2 x 64 x 256 x 2 = 196608


def test_check_block_k() -> None:
    assert n09.check_block_k(64).passed
    wrong = n09.check_block_k(128)
    assert not wrong.passed and wrong.attempted and "393216" in wrong.message
    assert not n09.check_block_k(...).attempted


def test_check_score_bytes() -> None:
    small = GPTConfig.preset("small")
    assert n09.check_score_bytes(8 * 4 * 128 * 128 * 2, small, 8).passed
    assert not n09.check_score_bytes(8 * 4 * 128 * 128 * 4, small, 8).passed
    assert not n09.check_score_bytes("many", small, 8).passed
    assert not n09.check_score_bytes(None, small, 8).attempted


def test_check_triton_target() -> None:
    assert n09.check_triton_target("__gpu$xla.gpu.triton", TRITON_HLO).passed
    assert not n09.check_triton_target("__cublas$lt$matmul", TRITON_HLO).passed
    assert not n09.check_triton_target(3, TRITON_HLO).passed
    assert not n09.check_triton_target(..., TRITON_HLO).attempted


def test_compile_attention_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown attention"):
        n09.compile_attention("magic", None, None, None)


def test_attention_inputs_shapes() -> None:
    q, k, v = n09.attention_inputs(GPTConfig.preset("tiny"), 2)
    assert q.shape == k.shape == v.shape == (2, 64, 4, 16) and str(q.dtype) == "bfloat16"
