"""labkit.xla.compare: metrics, diffs and schedule tables of handwritten HLO."""

from __future__ import annotations

from hlo_programs import ASYNC, SYNC

from labkit.xla import compare as collectives


def test_metrics_of_handwritten_hlo() -> None:
    m = collectives.metrics(ASYNC)
    assert m["all-reduce count"] == 2 and m["all-reduce bytes"] == 64 * 4 + 8 * 4
    assert m["async collectives"] == 1 and m["sync collectives"] == 1
    assert m["compute ops between start/done"] == 1  # a negate of 8 floats
    # that one kernel's 1 us floor covers part of the async all-reduce's 5 us latency;
    # the synchronous one is exposed
    verdicts = (m["hidden transfers"], m["partly hidden transfers"], m["exposed transfers"])
    assert verdicts == (0, 1, 1)
    assert m["transfers across loop iterations"] == 0 and m["send/recv pairs"] == 0
    assert m["pipelined"] == 1 and collectives.pipelined(ASYNC) == ["ars"]
    assert m["send/recv ops"] == 0 and m["collectives in loops"] == 0


def test_schedule_table_marks_modes_in_program_order() -> None:
    rows = collectives.schedule_table(ASYNC)
    assert [r["collective"] for r in rows] == ["ars", "ar"]
    assert rows[0]["transfer_us"] > rows[0]["compute_us"] >= 0
    assert rows[0] | {"computation": "", "transfer_us": 0, "compute_us": 0} == {
        "collective": "ars",
        "kind": "all-reduce",
        "bytes": 256,
        "computation": "",
        "in_loop": False,
        "mode": "async",
        "ops_between": 1,
        "compute_between": 1,
        "transfer_us": 0,
        "compute_us": 0,
        "pipelined": True,
        "matmuls_between": 0,
        "verdict": "partly hidden",  # one kernel's floor beside a 5 us latency
    }
    assert rows[1]["mode"] == "sync" and rows[1]["ops_between"] == 0 and not rows[1]["pipelined"]


def test_diff_changed_and_identical() -> None:
    d = collectives.diff(ASYNC, SYNC)
    assert d["all-reduce count"] == (2, 2)  # same collectives
    assert collectives.changed(d) == {
        "async collectives": (1, 0),
        "sync collectives": (1, 2),
        "compute ops between start/done": (1, 0),
        "pipelined": (1, 0),
        "partly hidden transfers": (1, 0),  # made synchronous, it is exposed
        "exposed transfers": (1, 2),
        "instructions": (12, 11),  # all computations
    }
    rows = collectives.diff_rows(d)
    assert rows[0] == {"metric": "async collectives", "before": 1, "after": 0}
    assert len(collectives.diff_rows(d, only_changed=False)) == len(d)
    assert collectives.identical(ASYNC, ASYNC.replace("%f = ", "%f = ", 1))
    assert collectives.identical(ASYNC, ASYNC + '\nFileNames\n1 "/home/x.py"\n')
    assert not collectives.identical(ASYNC, SYNC)
