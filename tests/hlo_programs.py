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
