"""labkit.xla.inspect_report and the HLO readers on programs the kit did not write.

The fixtures in tests/data/hlo/ are compiled H100 programs (no metadata, no file tables) of
the programs in tests/data/programs/: a scan-over-layers MLP with FSDP, a rematerialised MLP,
a shard_map collective matmul (also lowered, before partitioning), FP8 and int8 products
with a top-k (default program and cuBLAS variant). tests/data/make_hlo_fixtures.py made
them; every expected number below is worked out from the program's sizes.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from hlo_programs import ASYNC, SYNC
from test_findings import COMBINED, SPLIT_K
from xla_schedule_fixture import LOOPED, LOOPED_SCHEDULE

from labkit.xla import hlo, predict, xla_estimate
from labkit.xla.inspect_report import Report, build_report
from labkit.xla.inspect_schema import SCHEMA, SCHEMA_VERSION
from labkit.xla.memory import Memory
from labkit.xla.xla_schedule import read_schedule

DATA = Path(__file__).resolve().parent / "data" / "hlo"
FIXTURES = sorted(DATA.glob("*.hlo"))
COMPILED = [p for p in FIXTURES if ".lowered." not in p.name]
MFLOP = 1_048_576  # 2 x 8 x 256 x 256 = 2 x 8 x 128 x 512 = 2 x 32 x 64 x 256


def text(name: str) -> str:
    return (DATA / f"{name}.hlo").read_text()


def test_fixtures_are_small_and_stripped() -> None:
    assert {p.stem for p in FIXTURES} >= {
        "scan_mlp",
        "remat_mlp",
        "shard_map_matmul",
        "shard_map_matmul.lowered",
        "low_precision",
        "low_precision.cublas",
    }
    for path in FIXTURES:
        content = path.read_text()
        assert len(content) < 100_000, f"{path.name}: keep fixtures to tens of KB"
        assert "metadata={" not in content and "FileNames" not in content


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_every_instruction_and_shape_parses(path: Path) -> None:
    content = path.read_text()
    module = hlo.parse_module(content)
    assert module.is_scheduled == (".lowered." not in path.name)
    insts = hlo.instructions(content)
    assert len(insts) > 20
    for inst in insts:
        if inst.shape and "token[]" not in inst.shape:
            assert hlo.shape_bytes(inst.shape) >= 0
    for callee, caller in module.callers.items():
        assert callee in module.computations, f"{caller.name} calls unknown {callee}"
        assert callee in caller.callees()


@pytest.mark.parametrize("path", COMPILED, ids=lambda p: p.name)
def test_report_json_round_trip_and_schema(path: Path) -> None:
    report = build_report(path.read_text(), name=path.stem)
    data = json.loads(report.to_json())
    jsonschema.validate(data, SCHEMA)
    assert data["schema_version"] == SCHEMA_VERSION and data["memory"] is None
    assert Report.from_json(report.to_json()) == report
    assert report.step.lower_us <= report.step.upper_us


def test_scan_over_layers_fsdp() -> None:
    report = build_report(text("scan_mlp"), name="scan")
    assert [(lp.trip_count) for lp in report.loops] == [4, 4]  # forward and backward scans
    assert report.collective_counts() == {"all-gather": 3, "reduce-scatter": 2, "all-reduce": 1}
    in_loops = [c for c in report.collectives if c.per_step == 4]
    # one layer's bf16 (256, 256) weight gathered in each scan, its gradient scattered in one
    assert sorted((c.kind, c.bytes) for c in in_loops) == [
        ("all-gather", 256 * 256 * 2),
        ("all-gather", 256 * 256 * 2),
        ("reduce-scatter", 256 * 256 * 2),
    ]
    assert {c.computation for c in in_loops} == {lp.body for lp in report.loops}
    # per device (batch 8): 4 layers x (forward + 2 backward) + head x 3, 2*M*N*K each
    assert report.flops.per_device == 4 * 3 * MFLOP + 3 * 2 * 8 * 256 * 16
    assert report.flops.total == 8 * report.flops.per_device
    assert sum(g.flops * g.per_step for g in report.gemms) == report.flops.per_device
    assert {g.per_step for g in report.gemms} == {1, 4}


def test_remat_recomputes_forward_products() -> None:
    report = build_report(text("remat_mlp"), name="remat")
    # 3 blocks x (128 x 512 + 512 x 128) bf16 gradients, all-reduced at once; and the loss
    assert sorted(c.bytes for c in report.collectives) == [4, 3 * 2 * 128 * 512 * 2]
    assert {g.flops for g in report.gemms} == {MFLOP}  # every product is 8 x 128 x 512
    # without remat: 2 forward + 4 backward products per block; jax.checkpoint adds more
    assert len(report.gemms) > 3 * 6
    assert report.flops.per_device == len(report.gemms) * MFLOP
    assert report.loops == []


def test_shard_map_collective_matmul() -> None:
    report = build_report(text("shard_map_matmul"), name="ring")
    by_kind = {c.kind: c for c in report.collectives}
    assert set(by_kind) == {"collective-permute", "reduce-scatter", "all-to-all"}
    permute = by_kind["collective-permute"]
    assert (permute.mode, permute.per_step, permute.bytes) == ("async", 8, 64 * 256 * 2)
    assert permute.group_size is None  # pairs, not groups: read them from the HLO
    pairs = next(c for c in hlo.collectives(report.hlo) if c.kind == "collective-permute")
    assert sorted(pairs.source_target_pairs or []) == [(j, (j - 1) % 8) for j in range(8)]
    assert by_kind["reduce-scatter"].bytes == 32 * 256 * 4  # f32 accumulator, before scattering
    assert by_kind["all-to-all"].bytes == 32 * 32 * 4
    assert [lp.trip_count for lp in report.loops] == [8]
    assert [(g.flops, g.per_step) for g in report.gemms] == [(MFLOP, 8)]


def test_shard_map_region_before_partitioning() -> None:
    content = text("shard_map_matmul.lowered")
    module = hlo.parse_module(content)
    assert not module.is_scheduled and module.num_devices is None
    assert dict(hlo.custom_calls(content)) == {
        "xla.sdy.GlobalToLocalShape": 1,
        "xla.sdy.LocalToGlobalShape": 1,
    }
    body = next(c for c in module.computations if c.startswith("xla.sdy.manual_computation"))
    assert module.callers[body].opcode == module.called_by(body) == "call"
    found = {c.kind: c for c in hlo.collectives(content)}
    assert found["reduce-scatter"].called_by == "call"
    assert found["collective-permute"].called_by == "while"
    assert found["all-to-all"].replica_groups == [list(range(8))]


def test_fp8_and_int8_default_program_reads_narrow_types() -> None:
    report = build_report(text("low_precision"), name="low")
    assert report.collectives == [] and report.program.num_devices == 1
    fp8, int8 = sorted(report.gemms, key=lambda g: g.out)
    # XLA's default program: Triton GEMMs; FP8 is read and converted to bf16 inside the kernel
    assert (fp8.kernel, fp8.lhs, fp8.reads) == ("triton", "bf16", ("bf16", "f8e4m3fn"))
    assert (int8.kernel, int8.lhs, int8.out) == ("triton", "s8", "s32")
    assert int8.lhs_shape.startswith("s8[") and "{" not in int8.lhs_shape + int8.out_shape
    assert report.flops.per_device == 2 * (2 * 128 * 256 * 128)
    assert "kCustom" in report.fusions  # the top-k: a sort fusion


def test_fp8_and_int8_cublas_variant_calls_cublaslt() -> None:
    report = build_report(text("low_precision.cublas"), name="low")
    assert report.custom_calls == {"__cublas$lt$matmul": 1, "__cublas$lt$matmul$f8": 1}
    by_target = {g.target: g for g in report.gemms}
    assert by_target["__cublas$lt$matmul$f8"].lhs_shape == "f8e4m3fn[128,256]"
    assert by_target["__cublas$lt$matmul"].reads == ("s8",)
    assert {g.kernel for g in report.gemms} == {"cublas"}
    assert report.flops.per_device == 2 * (2 * 128 * 256 * 128)


def test_rendering() -> None:
    report = build_report(text("scan_mlp"), name="scan")
    markdown, plain = report.to_markdown(), report.to_text()
    assert report._repr_markdown_() == markdown and str(report) == plain
    assert markdown.startswith("### `scan` on 8 x H100 SXM") and "#### Collectives (6)" in markdown
    assert "#" not in plain.split("\n", 1)[0] and "Collectives (6)\n---" in plain
    for c in report.collectives:
        assert c.name in markdown and c.name in plain
    assert "not run; GEMM tiles chosen by the kit's rule" in plain and "not timed on a GPU" in plain
    untuned = build_report(text("scan_mlp"), name="scan", tiles="untuned").to_text()
    assert "not run; GEMM tiles untuned: XLA's first config that compiles" in untuned
    assert "low end  = max(" in plain  # the model's formula is printed with its terms
    assert "Step, the kit's model:" in plain and "upper bound" not in plain  # a range, named
    assert "| 2.0 | 10.0 |" in plain  # the range with both guessed constants doubled


def test_xla_estimate_beside_the_kit_and_findings() -> None:
    est = xla_estimate.estimate(read_schedule(LOOPED_SCHEDULE), LOOPED)
    report = build_report(LOOPED, name="looped", xla=est)
    x = report.xla_estimate
    assert x is not None and x.step_us == predict.round_sig(est.step_us)
    assert {t["term"] for t in x.terms} >= {"per-kernel floor", "transfer", "step"}
    assert {f["name"] for f in x.flagged} == {"c", "fs"}
    data = json.loads(report.to_json())
    jsonschema.validate(data, SCHEMA)
    assert Report.from_json(report.to_json()) == report  # XLA's section and findings round-trip
    assert report.summary()["XLA's model step us"] == x.step_us
    plain = report.to_text()
    assert "Step, XLA's model:" in plain and "fallback constants" in plain
    combined = build_report(COMBINED, name="combined")
    assert combined.xla_estimate is None and combined.findings.pack_unpack
    assert "combines 2 buffers" in combined.to_text()
    split = build_report(SPLIT_K, name="split")
    assert [k.splits for k in split.findings.split_k] == [4]
    assert "x4 (K=256)" in split.to_markdown()  # the GEMM row names its split
    assert Report.from_json(split.to_json()) == split


def test_memory_section_and_schema() -> None:
    memory = Memory(argument=1000, output=800, alias=800, temp=5_000_000, code=0, peak=5_500_000)
    report = build_report(text("remat_mlp"), name="remat", memory=memory, mesh={"data": 8})
    assert report.memory is not None and report.memory.total == 1000 + 800 - 800 + 5_000_000
    assert report.memory.fraction == report.memory.total / 80e9
    jsonschema.validate(json.loads(report.to_json()), SCHEMA)
    assert "Memory per device" in report.to_text()


def test_diff_of_a_schedule_change() -> None:
    before = build_report(ASYNC, name="m")
    after = build_report(SYNC, name="m")
    diff = before.diff(after)
    assert diff.value("async collectives") == (1, 0)
    assert diff.value("sync collectives") == (1, 2)
    assert diff.added == ["all-reduce 256 B f32 x8 (sync)"]
    assert diff.removed == ["all-reduce 256 B f32 x8 (async)"]
    assert (diff.before, diff.after) == ("m before", "after")
    assert {r["what"] for r in diff.changed()} >= {"async collectives", "sync collectives"}
    assert "| async collectives | 1 | 0 |" in diff.to_markdown()
    assert before.diff(before).changed() == []
    assert "Nothing in the report changed." in str(before.diff(before, ("a", "b")))
    with pytest.raises(KeyError, match="no row"):
        diff.value("magic")


def test_other_schema_versions_are_refused() -> None:
    data = build_report(ASYNC, name="m").to_dict()
    data["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(ValueError, match="schema_version"):
        Report.from_dict(data)
