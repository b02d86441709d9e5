"""Handwritten HLO programs shared by several test files, with exact answers known."""

from __future__ import annotations

# The module line and an add for reductions, for any handwritten program.
HEADER = """\
HloModule m, is_scheduled=true, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}
"""
# A kLoop fusion body: negate an f32[8].
FUSED = """
%fused (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %n = f32[8]{0} negate(%p)
}
"""

# Two all-reduces: an async pair with a fusion between (pipelined), and a synchronous one.
ASYNC = (
    HEADER
    + FUSED
    + """

ENTRY %main (a: f32[64], b: f32[8]) -> (f32[64], f32[8]) {
  %a = f32[64]{0} parameter(0)
  %b = f32[8]{0} parameter(1)
  %ars = ((f32[64]{0}), f32[64]{0}) all-reduce-start(%a), replica_groups={}, to_apply=%add, backend_config={"collective_backend_config":{"is_sync":false,"is_pipelined":true}}
  %f = f32[8]{0} fusion(%b), kind=kLoop, calls=%fused
  %ard = f32[64]{0} all-reduce-done(%ars)
  %ar = f32[8]{0} all-reduce(%f), replica_groups={}, to_apply=%add, backend_config={"collective_backend_config":{"is_sync":true}}
  ROOT %t = (f32[64]{0}, f32[8]{0}) tuple(%ard, %ar)
}
"""  # noqa: E501
)
# The same program with both all-reduces synchronous and nothing pipelined.
SYNC = (
    ASYNC.replace(
        "%ars = ((f32[64]{0}), f32[64]{0}) all-reduce-start(%a)", "%ard = f32[64]{0} all-reduce(%a)"
    )
    .replace('"is_sync":false,"is_pipelined":true', '"is_sync":true')
    .replace("  %ard = f32[64]{0} all-reduce-done(%ars)\n", "")
)

# Every way an instruction names the computations it calls: a fusion's calls, a reducer's
# to_apply, a call's to_apply, a loop's body and condition (two loops share them), a
# conditional's true/false computations and its branch_computations list.
CALLS = """\
HloModule calls, is_scheduled=true

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%neg (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %n = f32[8]{0} negate(%p)
}

%body (b: (s32[], f32[8])) -> (s32[], f32[8]) {
  %b = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%b), index=0
  %v = f32[8]{0} get-tuple-element(%b), index=1
  %f = f32[8]{0} fusion(%v), kind=kLoop, calls=%neg
  ROOT %t = (s32[], f32[8]{0}) tuple(%i, %f)
}

%cond (c: (s32[], f32[8])) -> pred[] {
  %c = (s32[], f32[8]{0}) parameter(0)
  ROOT %k = pred[] constant(true)
}

%yes (y0: f32[8]) -> f32[8] {
  ROOT %y0 = f32[8]{0} parameter(0)
}

%no (n0: f32[8]) -> f32[8] {
  %n0 = f32[8]{0} parameter(0)
  ROOT %cl = f32[8]{0} call(%n0), to_apply=%neg
}

ENTRY %main (a: f32[8], p: pred[], j: s32[]) -> f32[] {
  %a = f32[8]{0} parameter(0)
  %p = pred[] parameter(1)
  %j = s32[] parameter(2)
  %init = (s32[], f32[8]{0}) tuple(%j, %a)
  %w = (s32[], f32[8]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  %w2 = (s32[], f32[8]{0}) while(%w), condition=%cond, body=%body
  %v = f32[8]{0} get-tuple-element(%w2), index=1
  %tf = f32[8]{0} conditional(%p, %v, %v), true_computation=%yes, false_computation=%no
  %br = f32[8]{0} conditional(%j, %tf, %tf, %tf), branch_computations={%no, %yes, %no}
  %zero = f32[] constant(0)
  ROOT %r = f32[] reduce(%br, %zero), dimensions={0}, to_apply=%add
}
"""  # noqa: E501
