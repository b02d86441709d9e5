"""labkit.lessons.n01b_pjrt_plugins: plugin process, MLP export, layer table, checkers."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from labkit.lessons import n01b_pjrt_plugins as lesson
from labkit.runtime import pjrt, pjrt_wrapper


def test_the_plugin_package_is_installed() -> None:
    library = pjrt.plugin_library(lesson.PLUGIN_MODULE, load=False)
    assert library is not None and library.name.endswith(".so"), "run `make setup`"


def test_the_exported_mlp_takes_its_three_inputs() -> None:
    exported, inputs = lesson.export_mlp()
    assert [x.shape for x in inputs] == [(64, 256), (256, 512), (512, 16)]
    assert exported.platforms == ("cpu",) and len(exported.in_avals) == 3
    assert pjrt_wrapper.artifact_version(exported.mlir_module_serialized) is not None
    out = np.asarray(exported.call(*inputs))  # (64, 16)
    np.testing.assert_allclose(out, np.asarray(lesson.mlp(*inputs)), rtol=1e-6, atol=1e-6)


def test_export_target_version_is_what_jax_export_writes() -> None:
    exported, _ = lesson.export_mlp()
    written = pjrt_wrapper.artifact_version(exported.mlir_module_serialized)
    assert written == lesson.export_target_version()


def test_a_failing_plugin_process_says_why_and_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "broken.so").write_text("not a library")
    with pytest.raises(RuntimeError, match="the plugin process failed"):
        lesson.run_step_on_plugins({"broken": tmp_path / "broken.so"}, steps=1, builtin=False)
    assert pjrt.child_processes() == []


def test_layer_rows_name_every_layer_with_its_numbers() -> None:
    rows = lesson.layer_rows(
        {"ops": 1569, "bytes": 40_000, "version": (1, 16, 1)},
        {"PJRT_Client_Compile": 1, "PJRT_LoadedExecutable_Execute": 3},
        {"name": "lib.so", "c_api": "0.106", "framework_c_api": "0.116", "devices": 1},
        274.0,
        {"compile_s": 9.5, "step_ms": 22.0},
    )
    assert [r["layer"].split(" ")[0] for r in rows] == ["framework", "PJRT", "plugin", "compiler"]
    text = " ".join(r["measured here"] for r in rows)
    facts = ["1569 ops", "1.16.1", "1 Client_Compile", "3 LoadedExecutable_Execute", "0.106"]
    assert all(fact in text for fact in [*facts, "22 ms", "9.5 s", "274 ms"]), text


def test_checkers() -> None:
    log = pjrt_wrapper.Log(Counter(), [], Counter({"0xa": 3, "0xb": 1}), ["0xa", "0xb"])
    assert lesson.check_executes(3, log).passed
    assert not lesson.check_executes(4, log).passed and lesson.check_executes(4, log).attempted
    assert not lesson.check_executes(..., log).attempted
    ours, reference = np.float32([1.0, 2.0]), np.float64([1.0, 2.0 + 2**-20])
    assert lesson.check_max_error(2**-20, ours, reference).passed
    assert not lesson.check_max_error(0.0, ours, reference).passed
    assert not lesson.check_max_error("x", ours, reference).passed


def test_gelu_export_checker_runs_it_on_the_plugin() -> None:
    import jax

    library = pjrt.plugin_library(lesson.PLUGIN_MODULE, load=False)
    inputs = lesson.mlp_inputs()
    right = jax.export.export(jax.jit(lesson.gelu_mlp), platforms=("cpu",))(*inputs)
    assert lesson.check_gelu_export(right, library).passed
    tanh, _ = lesson.export_mlp()  # the lesson's tanh MLP: another function
    wrong = lesson.check_gelu_export(tanh, library)
    assert not wrong.passed and wrong.attempted and "differs" in wrong.message
    assert "jax.export" in lesson.check_gelu_export("bytes", library).message
    assert not lesson.check_gelu_export(..., library).attempted
