"""labkit.runtime.thunks: a deviceless H100 compile's thunk sequence and command buffers."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.gpt.compile import same_program_options
from labkit.runtime import thunks
from labkit.xla import hlo

# Lines as XLA writes them (jaxlib 0.12, a data-parallel MLP step for 8 H100s), shortened.
SEQUENCE = """\
000: kCommandBuffer [source       | next=004 (1)] 
    001: kCustomKernel [source       | next=002 (1)] gemm_fusion_dot_15 grid: [512, 1, 1] threads: [64, 1, 1]  shared_memory: 768 bytes
    002: kCustomKernel [prev=001 (1) | next=003 (1)] loop_reduce_fusion_3 grid: [64, 1, 1] threads: [128, 1, 1]  shared_memory: 0 bytes
    003: kCopy         [prev=002 (1) | sink        ] kCopy
004: kAllReduce     [prev=000 (1) | next=008 (2)] kAllReduce
005: kAsyncStart    [prev=000 (2) | next=000 (3)] stream=communication_stream[0], async_id=5
    006: kAllReduce [source | sink] kAllReduce
007: kCustomKernel  [prev=004 (2) | next=008 (2)] loop_convert_fusion grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
008: kAsyncDone     [source       | sink        ] async_id=5
000: kCommandBuffer [prev=008 (2) | sink        ] 
    009: kCustomKernel [source       | sink        ] loop_subtract_fusion grid: [512, 1, 1] threads: [128, 1, 1]  shared_memory: 0 bytes
"""  # noqa: E501, W291
METADATA = """\
thunk_metadata {
  thunk_info {
    profile_annotation: "command_buffer_1"
  }
  thunk_kind: "kCommandBuffer"
}
thunk_metadata {
  thunk_info {
    profile_annotation: "gemm_fusion_dot.15"
    thunk_id: 1
  }
  thunk_kind: "kCustomKernel"
}
"""


def test_parse_nesting_and_names() -> None:
    seq = thunks.parse_thunk_sequence(SEQUENCE)
    assert [t.kind for t in seq if t.depth == 0] == [
        "kCommandBuffer",
        "kAllReduce",
        "kAsyncStart",
        "kCustomKernel",
        "kAsyncDone",
        "kCommandBuffer",
    ]
    kernel = seq[1]
    assert (kernel.index, kernel.name, kernel.depth, kernel.parent) == (
        1,
        "gemm_fusion_dot_15",
        1,
        0,
    )
    inner = next(t for t in seq if t.index == 6)
    assert (inner.kind, inner.depth, inner.parent) == ("kAllReduce", 1, seq[5].position)
    assert seq[0].name == "" and seq[0].parent is None


def test_command_buffers_and_summary() -> None:
    seq = thunks.parse_thunk_sequence(SEQUENCE)
    graphs = thunks.command_buffers(seq)
    assert [len(g.commands) for g in graphs] == [3, 1]
    assert graphs[0].kinds == {"kCustomKernel": 2, "kCopy": 1}
    assert thunks.summary(seq) == {
        "top-level thunks": 6,
        "command buffers": 2,
        "commands in command buffers": 4,
        "kernels in command buffers": 3,
        "kernels outside": 1,
        "outside": {"kAllReduce": 1, "kAsyncStart": 1, "kCustomKernel": 1, "kAsyncDone": 1},
    }


def test_parse_rejects_other_text() -> None:
    assert thunks.parse_thunk_sequence("") == []
    with pytest.raises(ValueError, match="thunk_sequence"):
        thunks.parse_thunk_sequence("HloModule m\nENTRY %main {}")


def test_profile_annotations() -> None:
    assert thunks.profile_annotations(METADATA) == ["command_buffer_1", "gemm_fusion_dot.15"]


def test_read_dump_finds_one_module(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="dump_options"):
        thunks.read_dump(tmp_path)
    (tmp_path / "module_1.jit_f.thunk_sequence.txt").write_text(SEQUENCE)
    (tmp_path / "module_1.jit_f.thunk_metadata.txt").write_text(METADATA)
    dump = thunks.read_dump(tmp_path)
    assert dump.after_passes is None and dump.final == SEQUENCE
    (tmp_path / "module_1.jit_f.thunk_sequence_after_thunk_passes.txt").write_text("after")
    assert thunks.read_dump(tmp_path).final == "after"
    (tmp_path / "module_2.jit_g.thunk_sequence.txt").write_text(SEQUENCE)
    with pytest.raises(ValueError, match="a folder of its own"):
        thunks.read_dump(tmp_path)


def _chain(x):  # six dependent kernels on one GPU: enough for a command buffer (min size 5)
    import jax.numpy as jnp

    for _ in range(3):
        x = jnp.tanh(x @ x) + jnp.sum(x, axis=0)  # (n, n)
    return x


@pytest.mark.parametrize(
    ("options", "graphs"), [({}, 1), ({"xla_gpu_enable_command_buffer": ""}, 0)]
)
def test_a_real_deviceless_compile_writes_its_thunks(
    tmp_path: Path, options: dict, graphs: int
) -> None:
    import jax
    import jax.numpy as jnp

    from labkit.xla import aot

    mesh = aot.h100_mesh((1,), ("x",))
    x = aot.abstract(jax.ShapeDtypeStruct((256, 256), jnp.bfloat16), mesh)
    merged = {**same_program_options(), **thunks.dump_options(tmp_path), **options}
    result = aot.compile_for_gpu(_chain, x, compiler_options=merged)
    dump = thunks.read_dump(tmp_path)
    seq = thunks.parse_thunk_sequence(dump.final)
    assert thunks.summary(seq)["command buffers"] == graphs
    assert "command_buffer" not in result.hlo  # the HLO never shows them
    annotated = set(thunks.profile_annotations(dump.metadata))
    kernels = {i.name for i in hlo.instructions(result.hlo)}
    assert annotated & kernels  # profile annotations are HLO instruction names
