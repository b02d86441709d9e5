"""Tests for labkit.hlo: handwritten HLO with exact answers, then real CPU and H100 compiles."""

from __future__ import annotations

import gc
import weakref

import jax
import jax.numpy as jnp
import pytest
from hlo_programs import CALLS
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from labkit.xla import hlo, hlo_text

ALL8 = [[0, 1, 2, 3, 4, 5, 6, 7]]

# A scheduled module exercising the parser: tables with a path, a tiled layout, nested JSON
# with a "}" inside a string, frontend_attributes, /*index=5*/ comments, a two-line
# instruction, a Triton collective kernel, an async-start wrapper with an update, and a
# collective inside a fusion body.
HAND = """\
HloModule hand, is_scheduled=true, entry_computation_layout={(f32[8,4]{1,0})->f32[8,4]{1,0}}, num_partitions=8

FileNames
1 "/home/someone/private/train.py"

FunctionNames
1 "<module>"

FileLocations
1 {file_name_id=1 function_name_id=1 line=3 end_line=3 column=1 end_column=9}

StackFrames
1 {file_location_id=1 parent_frame_id=1}


%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%fused_gemm (p0: bf16[8,4], p1: bf16[4,4]) -> bf16[8,4] {
  %p0 = bf16[8,4]{1,0} parameter(0)
  %p1 = bf16[4,4]{1,0} parameter(1)
  ROOT %dot = bf16[8,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%triton_ar (q: f32[1024]) -> f32[1024] {
  %q = f32[1024]{0} parameter(0)
  ROOT %ar.inner = f32[1024]{0} all-reduce(%q), replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add
}

%async_rs (r: f32[64]) -> f32[16] {
  %r = f32[64]{0} parameter(0)
  ROOT %rs.inner = f32[16]{0} reduce-scatter(%r), replica_groups=[2,4]<=[8], dimensions={0}, to_apply=%add
}

%dyn (s0: s8[32]) -> s8[32] {
  %s0 = s8[32]{0} parameter(0)
  ROOT %a2a = s8[32]{0} all-to-all(%s0), replica_groups=mesh['x'=4,'y'=2], device_ids=([4,2]T(1,0)) {'x'}, dimensions={0}
}

ENTRY %main (a: f32[8,4], b: bf16[8,4], c: bf16[4,4], v: f32[1024], w: f32[64], s: s8[32]) -> f32[8,4] {
  %a = f32[8,4]{1,0} parameter(0), metadata={op_name="a"}
  %b = bf16[8,4]{1,0:T(8,128)(2,1)} parameter(1)
  %c = bf16[4,4]{1,0} parameter(2)
  %v = f32[1024]{0} parameter(3)
  %w = f32[64]{0} parameter(4)
  %s = s8[32]{0} parameter(5)
  %ars = ((f32[8,4]{1,0}), f32[8,4]{1,0}) all-reduce-start(%a), channel_id=1, replica_groups=[4,2]<=[2,4]T(1,0), use_global_device_ids=true, to_apply=%add, backend_config={"operation_queue_id":"0","collective_backend_config":{"is_sync":false,"note":{"deep":[1,{"x":"}"}]}}}
  %gemm = bf16[8,4]{1,0} fusion(%b, %c), kind=kCustom, calls=%fused_gemm, frontend_attributes={xla.pdl_launch="true"}, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion","block_level_fusion_config":{"output_tiles":[{"sizes":["16","8"]}]}}}
  %ard = f32[8,4]{1,0} all-reduce-done(%ars)
  %ags = ((bf16[8,4]{1,0}), bf16[16,4]{1,0}) all-gather-start(%gemm), channel_id=2, replica_groups=mesh['x'=4,'y'=2] {'y'}, dimensions={0}, use_global_device_ids=true
  %cst = f32[] constant(0)
  %agd = bf16[16,4]{1,0} all-gather-done(%ags)
  %tcs = ((f32[1024]{0}), f32[1024]{0}) fusion-start(%v), kind=kCustom, calls=%triton_ar, backend_config={"fusion_backend_config":{"kind":"__triton_collective"}}
  %tcd = f32[1024]{0} fusion-done(%tcs)
  %rss = ((f32[64]{0}), f32[16]{0}, s32[]) async-start(%w), calls=%async_rs
  %rsu = ((f32[64]{0}), f32[16]{0}, s32[]) async-update(%rss)
  %cc = f32[8,4]{1,0} custom-call(f32[8,4]{1,0} %a), custom_call_target="__cublas$lt$matmul"
  %rsd = f32[16]{0} async-done(%rsu)
  %dsf = s8[32]{0} fusion(%s), kind=kCustom, calls=%dyn, backend_config={"fusion_backend_config":{"kind":"__custom_fusion","custom_fusion_config":{"name":"dynamic_address_computation"}}}
  %perm = f32[8,4]{1,0} collective-permute(%ard), channel_id=3, source_target_pairs={{0,1},{1,0}}
  ROOT %tup = (f32[8,4]{1,0}, bf16[16,4]{1,0}, f32[1024]{0}, f32[16]{0}, f32[8,4]{1,0},
      /*index=5*/f32[8,4]{1,0}, s8[32]{0}) tuple(%ard, %agd, %tcd, %rsd, %perm, /*index=5*/%cc, %dsf)
}
"""  # noqa: E501

STABLEHLO = """\
module @jit_f attributes {mhlo.num_partitions = 8 : i32} {
  sdy.mesh @mesh = <["data"=8]>
  func.func public @main(%arg0: tensor<8x4xf32>) -> (tensor<8x4xf32>) {
    %0 = stablehlo.dot_general %arg0, %arg0, contracting_dims = [1] x [1] : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x8xf32>
    %1 = sdy.sharding_constraint %0 <@mesh, [{"data"}, {}]> : tensor<8x8xf32>
    %2 = call @relu(%arg0) : (tensor<8x4xf32>) -> tensor<8x4xf32>
    %3 = "stablehlo.all_reduce"(%2) <{replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %4 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %4 : tensor<f32>
    }) : (tensor<8x4xf32>) -> tensor<8x4xf32>
    return %3 : tensor<8x4xf32>
  }
  func.func private @relu(%arg0: tensor<8x4xf32>) -> tensor<8x4xf32> {
    %cst = stablehlo.constant dense<0.0> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<8x4xf32>
    %1 = stablehlo.maximum %arg0, %0 : tensor<8x4xf32>
    return %1 : tensor<8x4xf32>
  }
}
"""  # noqa: E501


# ---------------------------------------------------------------- handwritten HLO, exact values


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ("f32[8,4]{1,0}", 128),
        ("bf16[8,4]{1,0:T(8,128)(2,1)}", 64),
        ("(bf16[8,4]{1,0}, f32[])", 68),
        ("((f32[2]{0}), (s8[3]{0}, token[]))", 11),
        ("pred[10]", 10),
        ("c128[2]", 32),
        ("c64[2]", 16),
        ("f8e4m3fn[16,16]{1,0}", 256),
        ("f8e5m2[7]", 7),
        ("f8e8m0fnu[4]", 4),
        ("s4[16]{0}", 16),
        ("s4[16]{0:E(4)}", 8),
        ("u64[3]", 24),
        ("f32[<=8,4]", 128),
        ("token[]", 0),
        ("()", 0),
        ("f64[]", 8),
    ],
)
def test_shape_bytes(shape: str, expected: int) -> None:
    assert hlo.shape_bytes(shape) == expected


@pytest.mark.parametrize("bad", ["f99[3]", "f32[?]", "not a shape"])
def test_shape_bytes_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        hlo.shape_bytes(bad)


def test_instructions_parse_the_hard_parts() -> None:
    insts = {i.name: i for i in hlo.instructions(HAND)}
    assert len(insts) == 33
    assert insts["b"].shape == "bf16[8,4]{1,0:T(8,128)(2,1)}"
    gemm = insts["gemm"]
    assert (gemm.computation, gemm.opcode, gemm.operands) == ("main", "fusion", ("b", "c"))
    assert gemm.attr("frontend_attributes") == '{xla.pdl_launch="true"}'
    assert gemm.attr("kind") == "kCustom"
    ars = insts["ars"]
    assert ars.shape == "((f32[8,4]{1,0}), f32[8,4]{1,0})"
    assert ars.backend_config()["collective_backend_config"]["note"] == {"deep": [1, {"x": "}"}]}
    assert insts["cc"].operands == ("a",)  # operand printed with its shape
    root = insts["tup"]  # spans two lines, /*index=5*/ in shape and operands
    assert root.is_root and root.is_entry
    assert root.operands == ("ard", "agd", "tcd", "rsd", "perm", "cc", "dsf")
    assert hlo.shape_bytes(root.shape) == 128 + 128 + 4096 + 64 + 128 + 128 + 32
    assert not insts["sum"].is_entry and insts["sum"].is_root
    assert [i.name for i in hlo.entry_computation(HAND)][:3] == ["a", "b", "c"]
    assert hlo.entry_computation(HAND)[6].index == 6


def test_old_printer_forms() -> None:
    # No HloModule line, a quoted (escaped) backend_config, an mhlo attribute name.
    text = """ENTRY e {
  p = f32[4]{0} parameter(0), frontend_attributes={mhlo.sharding="{replicated}"}
  ROOT ar = f32[4]{0} all-reduce-start(p), replica_groups={}, backend_config="{\\"is_sync\\":true}"
}"""
    (ar,) = hlo.collectives(text)
    assert (ar.is_sync, ar.bytes, ar.replica_groups, ar.groups_form) == (True, 16, None, "explicit")
    assert hlo.instructions(text)[1].backend_config() == {"is_sync": True}
    assert "backend_config" not in hlo.strip_metadata(text, backend_config=True)


def test_instructions_without_percent_and_shapes() -> None:
    text = """HloModule m
ENTRY main {
  p0 = f32[2,2] parameter(0)
  start = ((f32[2,2]), f32[2,2], s32[]) fusion-start(p0),
      kind=kLoop, calls=leaf
  ROOT t = tuple(start)
}"""
    insts = hlo.instructions(text)
    assert [(i.name, i.opcode, i.shape, i.operands) for i in insts] == [
        ("p0", "parameter", "f32[2,2]", ()),
        ("start", "fusion-start", "((f32[2,2]), f32[2,2], s32[])", ("p0",)),
        ("t", "tuple", "", ("start",)),
    ]
    assert insts[1].attr("calls") == "leaf"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{{0,3,5,6},{1,2,4,7}}", [[0, 3, 5, 6], [1, 2, 4, 7]]),
        ("[4,2]<=[8]", [[0, 1], [2, 3], [4, 5], [6, 7]]),
        ("[2,4]<=[4,2]T(1,0)", [[0, 2, 4, 6], [1, 3, 5, 7]]),
        ("[4,2]<=[2,2,2]T(0,2,1)", [[0, 2], [1, 3], [4, 6], [5, 7]]),
        ("mesh['x'=4,'y'=2] {'x'}", [[0, 2, 4, 6], [1, 3, 5, 7]]),
        ("mesh['x'=4,'y'=2] {'y'}", [[0, 1], [2, 3], [4, 5], [6, 7]]),
        ("mesh['x'=4,'y'=2] {'x','y'}", ALL8),
        ("mesh['x'=4,'y'=2] {'y','x'}", [[0, 2, 4, 6, 1, 3, 5, 7]]),
        # Sub-axes: 'd':(pre)size is the factor `size` after a major factor `pre`; these
        # are XLA's replica_group_test.cc equivalences with the iota form.
        ("mesh['d'=8] {'d':(1)2}", [[0, 4], [1, 5], [2, 6], [3, 7]]),
        ("mesh['d'=8] {'d':(2)2}", [[0, 2], [1, 3], [4, 6], [5, 7]]),
        ("mesh['d'=8] {'d':(2)4}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
        ("mesh['d'=8] {'d':(1)2,'d':(4)2}", [[0, 1, 4, 5], [2, 3, 6, 7]]),
        (
            "mesh[a=6,b=6] {a:(1)3,b:(1)3}",
            [
                [0, 2, 4, 12, 14, 16, 24, 26, 28],
                [1, 3, 5, 13, 15, 17, 25, 27, 29],
                [6, 8, 10, 18, 20, 22, 30, 32, 34],
                [7, 9, 11, 19, 21, 23, 31, 33, 35],
            ],
        ),
        (
            "mesh[a=6,b=6] {b:(1)3,a:(1)3}",
            [
                [0, 12, 24, 2, 14, 26, 4, 16, 28],
                [1, 13, 25, 3, 15, 27, 5, 17, 29],
                [6, 18, 30, 8, 20, 32, 10, 22, 34],
                [7, 19, 31, 9, 21, 33, 11, 23, 35],
            ],
        ),
        ("mesh['x'=2,'y'=2], device_ids=(3,1,0,2) {'x'}", [[3, 0], [1, 2]]),
        ("mesh['a'=2,'b'=4], device_ids=([4,2]T(1,0)) {'a'}", [[0, 1], [2, 3], [4, 5], [6, 7]]),
    ],
)
def test_expand_replica_groups(text: str, expected: list[list[int]]) -> None:
    assert hlo.expand_replica_groups(text) == expected


def test_expand_replica_groups_empty_and_bad() -> None:
    assert hlo.expand_replica_groups("{}", num_devices=4) == [[0, 1, 2, 3]]
    assert hlo.expand_replica_groups("{}") is None
    with pytest.raises(ValueError, match="unrecognised"):
        hlo.expand_replica_groups("groups please")
    with pytest.raises(ValueError, match="do not nest"):
        hlo.expand_replica_groups("mesh['u'=30] {'u':(6)5,'u':(10)3}")


def test_collectives_handwritten() -> None:
    got = {c.name: c for c in hlo.collectives(HAND)}
    assert list(got) == ["a2a", "ars", "ags", "tcs", "rss", "perm"]  # inner ops counted once
    a2a, ars, ags, tcs, rss, perm = got.values()
    assert (a2a.kind, a2a.called_by, a2a.bytes, a2a.dtypes) == ("all-to-all", "fusion", 32, ("s8",))
    # device_ids=([4,2]T(1,0)) lays devices 0,2,4,6,1,3,5,7 on the 4x2 mesh; groups vary 'x'
    assert a2a.replica_groups == [[0, 4, 1, 5], [2, 6, 3, 7]] and a2a.groups_form == "mesh"
    assert (ars.kind, ars.bytes, ars.is_async, ars.is_sync) == ("all-reduce", 128, True, False)
    assert ars.replica_groups == [[0, 4], [1, 5], [2, 6], [3, 7]] and ars.groups_form == "iota"
    assert (ags.kind, ags.bytes, ags.group_size) == ("all-gather", 128, 2)  # gathered result
    assert (tcs.kind, tcs.kernel, tcs.bytes, tcs.is_async) == ("all-reduce", "triton", 4096, True)
    assert tcs.replica_groups == [[0, 1, 2, 3], [4, 5, 6, 7]] and tcs.groups_form == "explicit"
    assert (rss.kind, rss.opcode, rss.bytes) == ("reduce-scatter", "async-start", 256)
    assert rss.group_size == 4
    assert (perm.kind, perm.is_async, perm.bytes) == ("collective-permute", False, 128)
    assert perm.source_target_pairs == [(0, 1), (1, 0)] and perm.groups_form == "none"
    assert perm.replica_groups is None and perm.group_size is None


def test_async_pairs_handwritten() -> None:
    pairs = {p.start: p for p in hlo.async_pairs(HAND)}
    assert list(pairs) == ["ars", "ags", "tcs", "rss"]
    assert (pairs["ars"].done, pairs["ars"].ops_between, pairs["ars"].compute_between) == (
        "ard",
        ["gemm"],
        1,
    )
    assert (pairs["ags"].ops_between, pairs["ags"].compute_between) == (["cst"], 0)
    assert (pairs["tcs"].kind, pairs["tcs"].kernel, pairs["tcs"].ops_between) == (
        "all-reduce",
        "triton",
        [],
    )
    rs = pairs["rss"]  # matched through async-update
    assert (rs.done, rs.kind, rs.is_collective) == ("rsd", "reduce-scatter", True)
    assert (rs.ops_between, rs.opcodes_between) == (["rsu", "cc"], ["async-update", "custom-call"])
    assert rs.compute_between == 1
    sync = HAND.replace('"is_sync":false', '"is_sync":true')
    assert [p.is_sync for p in hlo.async_pairs(sync)] == [True, False, False, False]


def test_fusions_custom_calls_histogram_summary() -> None:
    assert hlo.fusions(HAND) == {
        "kCustom:__triton_nested_gemm_fusion": 1,
        "kCustom:__triton_collective": 1,
        "kCustom:__custom_fusion:dynamic_address_computation": 1,
    }
    assert hlo.custom_calls(HAND) == {"__cublas$lt$matmul": 1}
    ops = hlo.op_histogram(HAND)
    assert (ops["parameter"], ops["all-reduce"], ops["tuple"], ops["async-update"]) == (13, 1, 1, 1)
    assert hlo.op_histogram(HAND, top=1) == {"parameter": 13}
    s = hlo.summary(HAND)
    assert s["collectives"] == {
        "all-to-all": 1,
        "all-reduce": 2,
        "all-gather": 1,
        "reduce-scatter": 1,
        "collective-permute": 1,
    }
    assert s["collective_bytes"]["all-reduce"] == 128 + 4096
    assert (s["async_pairs"], s["pairs_with_compute_between"], s["async_collectives"]) == (4, 2, 4)
    assert (s["module"], s["is_scheduled"], s["num_devices"], s["instructions"]) == (
        "hand",
        True,
        8,
        33,
    )


def test_op_histogram_stablehlo() -> None:
    ops = hlo.op_histogram(STABLEHLO)
    assert ops["stablehlo.dot_general"] == 1
    assert ops["sdy.sharding_constraint"] == 1
    assert ops["func.call"] == 1
    assert ops["stablehlo.all_reduce"] == 1
    assert ops["func.func"] == 2 and ops["func.return"] == 2
    assert ops["stablehlo.add"] == 1 and ops["stablehlo.return"] == 1
    assert ops["sdy.mesh"] == 1 and ops["builtin.module"] == 1
    assert sum(ops.values()) == 15


def test_strip_tables_and_metadata() -> None:
    stripped = hlo.strip_tables(HAND)
    assert "/home/someone" not in stripped and "StackFrames" not in stripped
    assert hlo.instructions(stripped) == hlo.instructions(HAND)
    plain = hlo.strip_metadata(HAND)
    assert "metadata=" not in plain and "%a = f32[8,4]{1,0} parameter(0)\n" in plain
    bare = hlo.strip_metadata(HAND, backend_config=True)
    assert "backend_config" not in bare and "__triton" not in bare
    assert [i.name for i in hlo.instructions(bare)] == [i.name for i in hlo.instructions(HAND)]


def test_callees_name_every_called_computation() -> None:
    insts = {i.name: i for i in hlo.instructions(CALLS)}
    assert hlo.CALLEE_KEYS[:4] == ("calls", "to_apply", "body", "condition")
    assert insts["w"].callees() == ("body", "cond") and insts["w"].callees("body") == ("body",)
    assert insts["tf"].callees() == ("yes", "no")
    assert insts["br"].callees() == ("no", "yes", "no")  # a list, in order, repeats kept
    assert insts["f"].callees() == ("neg",) and insts["cl"].callees("to_apply") == ("neg",)
    assert insts["r"].callees() == ("add",) and insts["r"].callees("calls") == ()
    assert insts["v"].callees() == ()
    with pytest.raises(ValueError, match="pick from"):
        insts["w"].callees("backend_config")


def test_callers_hold_the_first_calling_instruction() -> None:
    module = hlo.parse_module(CALLS)
    insts = {i.name: i for i in hlo.instructions(CALLS)}
    assert set(module.callers) == set(module.computations) - {"main"}
    assert module.callers["body"] is insts["w"]  # w2 calls it too; w comes first
    assert module.callers["cond"] is insts["w"]
    assert module.callers["neg"] is insts["f"]  # before the call in %no
    assert (module.callers["yes"], module.callers["no"]) == (insts["tf"], insts["tf"])
    assert module.callers["add"] is insts["r"]
    assert module.called_by("body") == "while" and module.called_by("neg") == "fusion"
    assert module.called_by("main") is None and module.called_by("nothing") is None


def test_trip_count_of_loops() -> None:
    insts = {i.name: i for i in hlo.instructions(CALLS)}
    assert (insts["w"].trip_count, insts["w2"].trip_count, insts["r"].trip_count) == (5, None, None)


def _while(backend_config: str) -> hlo.Instruction:
    return hlo.Instruction("c", "w", "while", "", (), backend_config, False, True, 0)


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        ('body=%b, backend_config={"known_trip_count":{"n":"3"}}', 3),
        ('backend_config={"known_trip_count":{"n":0}}', 0),  # a JSON number, and zero trips
        ('backend_config="{\\"known_trip_count\\":{\\"n\\":\\"7\\"}}"', 7),  # old printer
        ('backend_config={"known_trip_count":{}}', None),
        ('backend_config={"known_trip_count":{"n":"-1"}}', None),
        ("backend_config={not json}", None),
        ("body=%b", None),
    ],
)
def test_trip_count_forms(attrs: str, expected: int | None) -> None:
    assert _while(attrs).trip_count == expected


@pytest.mark.parametrize("text", ["hello world", "", "ENTRY %m {\n  %p = f32[] parameter(0)\n"])
def test_not_hlo_raises(text: str) -> None:
    with pytest.raises(ValueError, match="not HLO text"):
        hlo.collectives(text)


def test_stablehlo_given_to_hlo_parser_says_what_to_do() -> None:
    with pytest.raises(ValueError, match="dialect='hlo'"):
        hlo.instructions(STABLEHLO)


# ---------------------------------------------------------------- real CPU compiles (8 devices)


@pytest.fixture(scope="module")
def mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


@pytest.fixture(scope="module")
def mesh8() -> jax.sharding.Mesh:
    return jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))


def _shard_map_hlo(body, mesh, in_specs, out_specs, x) -> str:  # type: ignore[no-untyped-def]
    f = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    return jax.jit(f).lower(x).compile().as_text()


def test_cpu_psum_groups_follow_the_mesh(mesh: jax.sharding.Mesh) -> None:
    x = jnp.ones((64, 16), jnp.float32)
    text = _shard_map_hlo(lambda x: jax.lax.psum(x, "data"), mesh, P("data", "model"), P(), x)
    (c,) = hlo.collectives(text)
    by_model = [[d.id for d in mesh.devices[:, j]] for j in range(2)]  # same 'model' index
    assert c.replica_groups == by_model == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert (c.kind, c.groups_form, c.dtypes) == ("all-reduce", "mesh", ("f32",))
    assert c.bytes == 16 * 8 * 4  # the (16, 8) f32 shard each device holds
    assert "replica_groups=mesh['data'=4,'model'=2] {'data'}" in text


def test_cpu_all_gather_and_reduce_scatter_bytes(mesh8: jax.sharding.Mesh) -> None:
    x = jnp.ones((64, 16), jnp.float32)  # 4096 bytes
    gather = lambda x: jax.lax.all_gather(x, "d", tiled=True)  # noqa: E731
    (ag,) = hlo.collectives(_shard_map_hlo(gather, mesh8, P("d"), P(), x))
    assert (ag.kind, ag.bytes, ag.replica_groups) == ("all-gather", 4096, ALL8)
    scatter = lambda x: jax.lax.psum_scatter(x, "d", tiled=True)  # noqa: E731
    (rs,) = hlo.collectives(_shard_map_hlo(scatter, mesh8, P(), P("d"), x))
    assert (rs.kind, rs.bytes, rs.group_size) == ("reduce-scatter", 4096, 8)


def test_cpu_permute_and_all_to_all(mesh: jax.sharding.Mesh) -> None:
    x = jnp.ones((64, 16), jnp.float32)
    ring = [(i, (i + 1) % 4) for i in range(4)]
    permute = lambda x: jax.lax.ppermute(x, "data", ring)  # noqa: E731
    spec = P("data", "model")
    (cp,) = hlo.collectives(_shard_map_hlo(permute, mesh, spec, spec, x))
    assert cp.kind == "collective-permute" and cp.bytes == 16 * 8 * 4
    ring_ids = [(0, 2), (2, 4), (4, 6), (6, 0), (1, 3), (3, 5), (5, 7), (7, 1)]  # device ids
    assert cp.source_target_pairs == ring_ids
    a2a = lambda x: jax.lax.all_to_all(x, "data", 0, 1, tiled=True)  # noqa: E731
    spec_out = P(None, ("data", "model"))
    (aa,) = hlo.collectives(_shard_map_hlo(a2a, mesh, spec, spec_out, x))
    assert (aa.kind, aa.bytes) == ("all-to-all", 512)
    assert aa.replica_groups == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_cpu_iota_groups_from_gspmd(mesh: jax.sharding.Mesh) -> None:
    x = jax.device_put(jnp.ones((64, 16)), NamedSharding(mesh, P("data", "model")))
    text = jax.jit(lambda x: x @ x.T).lower(x).compile().as_text()
    got = {c.kind: c for c in hlo.collectives(text)}
    assert "replica_groups=[2,4]<=[4,2]T(1,0)" in text
    assert got["all-gather"].groups_form == got["all-reduce"].groups_form == "iota"
    assert got["all-gather"].replica_groups == [[0, 2, 4, 6], [1, 3, 5, 7]]  # along 'data'
    assert got["all-reduce"].replica_groups == [[0, 1], [2, 3], [4, 5], [6, 7]]  # along 'model'


def test_cpu_mesh_sub_axes(mesh8: jax.sharding.Mesh) -> None:
    # Rows 0-31 of the (64,) axis live on devices 0-3: summing reshape(2,32,16) over axis 1
    # must all-reduce within {0,1,2,3} and {4,5,6,7}; regathering axis 0 pairs d with d+4.
    z = jax.device_put(jnp.ones((64, 16)), NamedSharding(mesh8, P("d")))
    text = jax.jit(lambda z: z.reshape(2, 32, 16).sum(1)).lower(z).compile().as_text()
    got = {c.kind: c for c in hlo.collectives(text)}
    assert "{'d':(2)4}" in text and "{'d':(1)2}" in text
    assert got["all-reduce"].replica_groups == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert got["all-gather"].replica_groups == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_cpu_explicit_groups_from_axis_index_groups() -> None:
    groups = [[0, 3, 5, 6], [1, 2, 4, 7]]
    f = jax.pmap(lambda x: jax.lax.psum(x, "i", axis_index_groups=groups), axis_name="i")
    (c,) = hlo.collectives(f.lower(jnp.ones((8, 4))).compile().as_text())
    assert (c.groups_form, c.replica_groups, c.group_size) == ("explicit", groups, 4)


def test_cpu_text_tables_and_stablehlo(mesh: jax.sharding.Mesh) -> None:
    x = jax.device_put(jnp.ones((64, 16)), NamedSharding(mesh, P("data", "model")))
    rows = NamedSharding(mesh, P("data"))
    f = jax.jit(lambda x: jax.lax.with_sharding_constraint(x @ x.T, rows).sum())
    lowered = f.lower(x)
    ops = hlo.op_histogram(lowered.as_text())
    assert (ops["stablehlo.dot_general"], ops["sdy.sharding_constraint"]) == (1, 1)
    text = lowered.compile().as_text()
    assert __file__ in text and __file__ not in hlo.strip_tables(text)
    assert hlo.instructions(hlo.strip_tables(text)) == hlo.instructions(text)


# ---------------------------------------------------------------- deviceless H100 compiles


def _dp_grad_hlo(compiler_options: dict[str, int | bool]) -> str:
    from labkit.xla import aot as gpu_aot

    h100 = gpu_aot.h100_mesh((8,), ("data",))

    def loss(ws, x):  # type: ignore[no-untyped-def]
        for w in ws:
            x = jnp.tanh(x @ w)  # (batch, 1024)
        return jnp.sum(x)

    ws = gpu_aot.abstract([jnp.zeros((1024, 1024), jnp.bfloat16)] * 4, h100)
    x = gpu_aot.abstract(jnp.zeros((64, 1024), jnp.bfloat16), h100, P("data"))
    return gpu_aot.compile_for_gpu(jax.grad(loss), ws, x, compiler_options=compiler_options).hlo


@pytest.mark.aot
def test_h100_data_parallel_one_async_all_reduce_per_gradient() -> None:
    text = _dp_grad_hlo({"xla_gpu_all_reduce_combine_threshold_bytes": 0})
    colls = hlo.collectives(text)
    # NCCL all-reduces, no Triton collective kernels with this jaxlib and target; the last
    # gradient's all-reduce has nothing left to overlap with and is made synchronous.
    assert [(c.kind, c.kernel, c.bytes) for c in colls] == [("all-reduce", "default", 2**21)] * 4
    assert [(c.is_async, c.is_sync) for c in colls] == [(True, False)] * 3 + [(False, True)]
    assert all(c.replica_groups == ALL8 and c.groups_form == "mesh" for c in colls)
    pairs = hlo.async_pairs(text)
    assert [p.kind for p in pairs] == ["all-reduce"] * 3
    assert all(p.compute_between and "fusion" in p.opcodes_between for p in pairs)
    assert [p.compute_between for p in pairs] == [3, 3, 3]  # 2 gemm fusions + 1 loop fusion
    # 11 dots: 4 forward, 4 weight gradients, 3 input gradients (none for the input x)
    assert hlo.fusions(text)["kCustom:__triton_nested_gemm_fusion"] == 11
    s = hlo.summary(text)
    assert (s["async_pairs"], s["pairs_with_compute_between"], s["collective_bytes"]) == (
        3,
        3,
        {"all-reduce": 4 * 2**21},
    )


@pytest.mark.aot
def test_h100_data_parallel_combined_and_cublas() -> None:
    text = _dp_grad_hlo({"xla_gpu_enable_triton_gemm": False})
    (c,) = hlo.collectives(text)  # default threshold: the 4 gradients in one all-reduce
    assert (c.bytes, c.dtypes, c.is_async) == (4 * 2**21, ("bf16",), False)
    assert hlo.custom_calls(text) == {"__cublas$lt$matmul": 11}  # the same 11 dots
    assert not any(k.startswith("kCustom") for k in hlo.fusions(text))
    assert hlo.async_pairs(text) == []


def test_collective_and_kernel_counts() -> None:
    text = """HloModule m, is_scheduled=true, num_partitions=2

%fused (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(%p)
}

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %f = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused
  %c = (f32[4]{0}, s8[8]{0}) custom-call(%f, %f), custom_call_target="__cublas$lt$matmul"
  %g = f32[4]{0} get-tuple-element(%c), index=0
  %ar = f32[4]{0} all-reduce-start(%g), replica_groups={{0,1}}, to_apply=%sum
  %ad = f32[4]{0} all-reduce-done(%ar)
  ROOT %r = f32[4]{0} all-reduce(%ad), replica_groups={{0,1}}, to_apply=%sum
}
"""
    assert hlo.collective_counts(text) == {"all-reduce": 2}  # the async pair counts once
    assert hlo.kernel_counts(text) == {"kLoop": 1, "__cublas$lt$matmul": 1}


def test_independent_kernels_are_what_could_overlap() -> None:
    from hlo_programs import ASYNC

    assert hlo.independent_kernels(ASYNC, "ars") == ["f"]  # f neither feeds nor uses it
    assert hlo.independent_kernels(ASYNC, "ar") == []  # f feeds the sync all-reduce
    with pytest.raises(ValueError, match="no instruction named"):
        hlo.independent_kernels(ASYNC, "nope")


def test_a_fact_cached_per_module_lives_as_long_as_the_module() -> None:
    calls: list[str] = []

    @hlo_text.per_module
    def entry_name(module: hlo_text.Module, suffix: str) -> str:
        calls.append(suffix)
        return module.entry + suffix

    text = "HloModule m\n\nENTRY %main (p: f32[2]) -> f32[2] {\n  ROOT %p = f32[2] parameter(0)\n}"
    module = hlo_text.parse_module(text)
    assert entry_name(module, "!") == entry_name(module, "!") == "main!"
    assert calls == ["!"]  # computed once for this parse
    hlo_text.parse_module.cache_clear()
    again = hlo_text.parse_module(text)
    assert again is not module and entry_name(again, "!") == "main!"
    assert calls == ["!", "!"]  # a new parse is a new module
    gone = weakref.ref(module)
    del module
    gc.collect()
    assert gone() is None  # the cache does not keep a module alive
