"""labkit.xla.xla_schedule: XLA's latency-hiding schedule dump, read from handwritten text."""

from __future__ import annotations

from pathlib import Path

import pytest
from xla_schedule_fixture import LOOPED_SCHEDULE

from labkit.xla import xla_schedule

# The text form as XLA writes it: nested messages, repeated fields, strings holding braces.
SMALL = """\
hlo_module {
  name: "m"
  computations {
    name: "main"
    instructions {
      name: "x"
      opcode: "parameter"
      metadata {
        op_name: "jit(f)/a {b}"
      }
      id: 5
    }
    id: 9
  }
}
computation_schedules {
  computation_id: 9
  instructions {
    id: 5
    start_timestamp_cycles: 2
    end_timestamp_cycles: 6
  }
  scheduler_statistics {
    total_cycles: 8
  }
  cycles_per_microsecond: 2
}
"""


def test_text_proto_nests_and_repeats() -> None:
    msg = xla_schedule.parse_text_proto(SMALL)
    module = msg["hlo_module"][0]
    assert isinstance(module, dict) and module["name"] == ['"m"']
    comp = module["computations"][0]
    assert isinstance(comp, dict)
    inst = comp["instructions"][0]
    assert isinstance(inst, dict) and inst["metadata"] == [{"op_name": ['"jit(f)/a {b}"']}]
    with pytest.raises(ValueError, match="closes nothing"):
        xla_schedule.parse_text_proto("}\n")
    with pytest.raises(ValueError, match="left open"):
        xla_schedule.parse_text_proto("a {\n")
    with pytest.raises(ValueError, match=r"schedule\.txt"):
        xla_schedule.parse_text_proto("not a field\n")


def test_cycles_become_microseconds() -> None:
    dump = xla_schedule.read_schedule(SMALL)
    (main,) = dump.computations.values()
    assert (dump.module, main.name, dump.cycles_per_us) == ("m", "main", 2.0)
    (x,) = main.ops
    assert (x.name, x.start_us, x.end_us, x.cost_us) == ("x", 1.0, 3.0, 2.0)
    assert main.total_us == 4.0 and main.wasted_us == {}


def test_handwritten_dump_of_a_loop() -> None:
    dump = xla_schedule.read_schedule(LOOPED_SCHEDULE)
    assert dump.module == "looped" and set(dump.computations) == {"body", "main"}
    body, main = dump.computations["body"], dump.computations["main"]
    assert [op.name for op in body.ops] == ["p", "i", "w", "v", "ars", "g", "ard", "n", "t"]
    assert body.op("ard") is not None and body.op("ard").operands == ("ars",)  # type: ignore[union-attr]
    # costs are end - start; an async start's window is end(done) - end(start)
    assert body.cost_us == pytest.approx(14.5) and body.total_us == 31.5
    assert body.wasted_us == {"all-reduce": 17.0} and body.other_waits_us == pytest.approx(0.0)
    windows = {op.name: op.window_us for op in main.ops if op.window_us is not None}
    assert windows == {"ars": pytest.approx(1.5), "fs": pytest.approx(5000.0)}
    assert main.other_waits_us == pytest.approx(5001.02 - 2.04 - 0.49)


def test_read_folder(tmp_path: Path) -> None:
    assert xla_schedule.read_folder(tmp_path) is None  # XLA wrote none: nothing to schedule
    (tmp_path / "looped.schedule.txt").write_text(LOOPED_SCHEDULE)
    (tmp_path / "other.schedule.txt").write_text(SMALL)
    with pytest.raises(ValueError, match="name the module"):
        xla_schedule.read_folder(tmp_path)
    found = xla_schedule.read_folder(tmp_path, "looped")
    assert found is not None and found.module == "looped"
    assert xla_schedule.dump_options(tmp_path) == {
        "xla_dump_to": str(tmp_path),
        "xla_dump_latency_hiding_schedule": True,
    }
