"""labkit.kernels.attention: the attention variants, the score-buffer reader, cuDNN's presence."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from labkit.kernels import attention
from labkit.xla import hlo

SCORES_HLO = """\
HloModule m, is_scheduled=true

ENTRY %main (p: bf16[2,4,8,8]) -> bf16[2,4,8,8] {
  %p = bf16[2,4,8,8]{3,2,1,0} parameter(0)
  %f = bf16[2,4,8,8]{3,2,1,0} fusion(%p), kind=kLoop, calls=%c
  ROOT %g = bf16[2,4,8,8]{3,2,1,0} custom-call(%f), custom_call_target="__cudnn$fmhaSoftmax"
}
"""


def test_plain_and_default_attention_agree() -> None:
    q, k, v = (jax.random.normal(jax.random.key(i), (1, 64, 2, 16), jnp.float32) for i in range(3))
    plain = attention.plain_attention(q, k, v)
    assert float(jnp.abs(plain - attention.default_attention(q, k, v)).max()) < 1e-5
    grads = attention.with_grad(attention.plain_attention)(q, k, v)
    assert [g.shape for g in grads] == [q.shape] * 3


def test_hlo_readers() -> None:
    assert hlo.kernel_counts(SCORES_HLO) == {"kLoop": 1, "__cudnn$fmhaSoftmax": 1}
    assert attention.score_buffers(SCORES_HLO, 2, 4, 8) == [("bf16", 1024), ("bf16", 1024)]
    assert attention.score_buffers(SCORES_HLO, 2, 4, 16) == []
    squeezed = SCORES_HLO.replace("bf16[2,4,8,8]", "bf16[4,8,8]")
    assert attention.score_buffers(squeezed, 1, 4, 8) == [("bf16", 512), ("bf16", 512)]


def test_cudnn_installed_is_a_version_or_none() -> None:
    found = attention.cudnn_installed()
    assert found is None or found.startswith("9.")
