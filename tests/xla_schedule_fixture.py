"""A handwritten compiled program with a loop, and the schedule dump XLA would write for it.

LOOPED runs a 3-trip loop whose body overlaps an all-reduce with a GEMM, then an all-reduce,
an async fusion and a custom (non-GEMM) fusion in the entry. LOOPED_SCHEDULE is the
``ScheduleProto`` text (as ``xla_dump_latency_hiding_schedule`` writes it: one field per line)
with costs chosen by hand; the numbers every test expects are worked out below.

Body (runs 3 times): ars 1, g (GEMM) 12, ard 1 (window: end(ard) - end(ars) = 31 - 1 = 30),
n (loop fusion) 0.5: costs 14.5; the all-reduce waits 30 - 13 = 17: total 31.5.
Entry: w 0.01, ars 1, fs 0.01, c (custom fusion) 0.01, ard 1 (window 1.5: short, an upper
bound), fd 0.01 (fs's window 5000: a fallback constant): costs 2.04, all-reduce wait 0.49,
total 5001.02 (the rest, 4998.49, waits for the async fusion).
"""

from __future__ import annotations

LOOPED = """\
HloModule looped, is_scheduled=true, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%neg (q: f32[8]) -> f32[8] {
  %q = f32[8]{0} parameter(0)
  ROOT %o = f32[8]{0} negate(%q)
}

%soft (r: f32[8]) -> f32[8] {
  %r = f32[8]{0} parameter(0)
  ROOT %e = f32[8]{0} exponential(%r)
}

%gemm (l: f32[64,64], m: f32[64,64]) -> f32[64,64] {
  %l = f32[64,64]{1,0} parameter(0)
  %m = f32[64,64]{1,0} parameter(1)
  ROOT %d = f32[64,64]{1,0} dot(%l, %m), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (p: (s32[], f32[64,64], f32[8])) -> (s32[], f32[64,64], f32[8]) {
  %p = (s32[], f32[64,64]{1,0}, f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %w = f32[64,64]{1,0} get-tuple-element(%p), index=1
  %v = f32[8]{0} get-tuple-element(%p), index=2
  %ars = ((f32[8]{0}), f32[8]{0}) all-reduce-start(%v), replica_groups={}, to_apply=%add
  %g = f32[64,64]{1,0} fusion(%w, %w), kind=kCustom, calls=%gemm, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
  %ard = f32[8]{0} all-reduce-done(%ars)
  %n = f32[8]{0} fusion(%ard), kind=kLoop, calls=%neg
  ROOT %t = (s32[], f32[64,64]{1,0}, f32[8]{0}) tuple(%i, %g, %n)
}

%cond (k: (s32[], f32[64,64], f32[8])) -> pred[] {
  %k = (s32[], f32[64,64]{1,0}, f32[8]{0}) parameter(0)
  ROOT %c0 = pred[] constant(true)
}

ENTRY %main (a: f32[64,64], b: f32[8]) -> (f32[8], f32[8], f32[8]) {
  %a = f32[64,64]{1,0} parameter(0)
  %b = f32[8]{0} parameter(1)
  %j = s32[] constant(0)
  %init = (s32[], f32[64,64]{1,0}, f32[8]{0}) tuple(%j, %a, %b)
  %wl = (s32[], f32[64,64]{1,0}, f32[8]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %x = f32[8]{0} get-tuple-element(%wl), index=2
  %ars = ((f32[8]{0}), f32[8]{0}) all-reduce-start(%x), replica_groups={}, to_apply=%add
  %fs = ((f32[8]{0}), f32[8]{0}, u32[]) fusion-start(%b), kind=kLoop, calls=%neg
  %c = f32[8]{0} fusion(%b), kind=kCustom, calls=%soft
  %ard = f32[8]{0} all-reduce-done(%ars)
  %fd = f32[8]{0} fusion-done(%fs)
  ROOT %out = (f32[8]{0}, f32[8]{0}, f32[8]{0}) tuple(%ard, %c, %fd)
}
"""  # noqa: E501


def _inst(name: str, opcode: str, ident: int, operands: tuple[int, ...] = ()) -> str:
    ops = "".join(f"      operand_ids: {o}\n" for o in operands)
    return (
        f'    instructions {{\n      name: "{name}"\n      opcode: "{opcode}"\n'
        f"      id: {ident}\n{ops}      frontend_attributes {{\n      }}\n    }}\n"
    )


def _timed(ident: int, start: float, end: float) -> str:
    return (
        f"  instructions {{\n    id: {ident}\n    start_timestamp_cycles: {start}\n"
        f"    end_timestamp_cycles: {end}\n    memory_usage_after: 64\n  }}\n"
    )


# ids: body 20.., entry 40..; the dump names computations by id (body 2, entry 1)
_BODY = [
    ("p", "parameter", 20, (), 0.0, 0.0),
    ("i", "get-tuple-element", 21, (20,), 0.0, 0.0),
    ("w", "get-tuple-element", 22, (20,), 0.0, 0.0),
    ("v", "get-tuple-element", 23, (20,), 0.0, 0.0),
    ("ars", "all-reduce-start", 24, (23,), 0.0, 1.0),
    ("g", "fusion", 25, (22, 22), 1.0, 13.0),
    ("ard", "all-reduce-done", 26, (24,), 30.0, 31.0),
    ("n", "fusion", 27, (26,), 31.0, 31.5),
    ("t", "tuple", 28, (21, 25, 27), 31.5, 31.5),
]
_ENTRY = [
    ("a", "parameter", 40, (), 0.0, 0.0),
    ("b", "parameter", 41, (), 0.0, 0.0),
    ("j", "constant", 42, (), 0.0, 0.0),
    ("init", "tuple", 43, (42, 40, 41), 0.0, 0.0),
    ("wl", "while", 44, (43,), 0.0, 0.01),
    ("x", "get-tuple-element", 45, (44,), 0.01, 0.01),
    ("ars", "all-reduce-start", 46, (45,), 0.01, 1.01),
    ("fs", "fusion-start", 47, (41,), 1.01, 1.02),
    ("c", "fusion", 48, (41,), 1.02, 1.03),
    ("ard", "all-reduce-done", 50, (46,), 1.51, 2.51),
    ("fd", "fusion-done", 49, (47,), 5001.01, 5001.02),
    ("out", "tuple", 51, (50, 48, 49), 5001.02, 5001.02),
]


def _schedule() -> str:
    head = '  name: "looped"\n  entry_computation_name: "main"\n'
    body = "".join(_inst(n, o, i, ops) for n, o, i, ops, _, _ in _BODY)
    entry = "".join(_inst(n, o, i, ops) for n, o, i, ops, _, _ in _ENTRY)
    module = (
        f'hlo_module {{\n{head}  computations {{\n    name: "body"\n{body}    id: 2\n  }}\n'
        f'  computations {{\n    name: "main"\n{entry}    id: 1\n  }}\n  id: 7\n}}\n'
    )
    body_sched = "".join(_timed(i, s, e) for _, _, i, _, s, e in _BODY)
    entry_sched = "".join(_timed(i, s, e) for _, _, i, _, s, e in _ENTRY)
    return (
        module
        + "computation_schedules {\n  computation_id: 2\n"
        + body_sched
        + "  scheduler_statistics {\n    all_reduce_wasted_cycles: 17\n"
        + "    total_wasted_cycles: 17\n    total_cycles: 31.5\n  }\n"
        + "  cycles_per_microsecond: 1\n}\n"
        + "computation_schedules {\n  computation_id: 1\n"
        + entry_sched
        + "  scheduler_statistics {\n    all_reduce_wasted_cycles: 0.49\n"
        + "    total_wasted_cycles: 0.49\n    total_cycles: 5001.02\n  }\n"
        + "  cycles_per_microsecond: 1\n}\n"
    )


LOOPED_SCHEDULE = _schedule()
# Worked by hand (see the module docstring): the step is the entry plus 3 x the body.
STEP_US = 5001.02 + 3 * 31.5
KERNEL_US = 3 * (12.0 + 0.5) + 0.01  # g and n per trip, c once
TRANSFER_US = 3 * 30.0 + 1.5
EXPOSED_US = 3 * 17.0 + 0.49
OTHER_WAITS_US = 5001.02 - 2.04 - 0.49  # the async fusion's fixed 5000, less what overlapped
