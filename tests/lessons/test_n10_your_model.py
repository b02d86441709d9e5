"""labkit.lessons.n10_your_model: sharded abstract inputs, and the checkers (right passes,
wrong fails, unanswered is to do). Reports come from the saved HLO fixtures: no compile."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from labkit.lessons import n10_your_model as n10
from labkit.xla.inspect_report import Report, build_report
from labkit.xla.memory import Memory

HLO = Path(__file__).resolve().parent.parent / "data" / "hlo"


def named(d_in: int, d_out: int, names: tuple[str, str], rngs: nnx.Rngs) -> nnx.Linear:
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), names)
    return nnx.Linear(d_in, d_out, use_bias=False, kernel_init=init, rngs=rngs)


class Tiny(nnx.Module):
    """Two kernels with logical axis names, as the notebook's Mixer has."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.up = named(16, 64, ("embed", "mlp"), rngs)
        self.down = named(64, 16, ("mlp", "embed"), rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(jax.nn.relu(self.up(x)))


def abstract_tiny() -> tuple[Tiny, nnx.Optimizer[Tiny]]:
    with nnx.use_eager_sharding(False):
        model = nnx.eval_shape(lambda: Tiny(nnx.Rngs(0)))
        optimizer = nnx.eval_shape(
            lambda: nnx.Optimizer(Tiny(nnx.Rngs(0)), optax.adamw(1e-3), wrt=nnx.Param)
        )
    return model, optimizer


def report(name: str, argument: int = 0) -> Report:
    memory = Memory(argument=argument, output=0, alias=0, temp=0, code=0, peak=None)
    return build_report((HLO / f"{name}.hlo").read_text(), name=name, memory=memory)


def test_sharded_follows_the_strategy_rules() -> None:
    model, optimizer = abstract_tiny()
    got, opt, images, labels = n10.train_inputs(model, optimizer, "fsdp", 16, (8, 8, 3))
    mesh = images.sharding.mesh
    assert got.up.kernel.sharding == NamedSharding(mesh, P("data", None))  # embed -> data
    assert got.down.kernel.sharding == NamedSharding(mesh, P(None, "data"))
    moments = jax.tree.leaves(nnx.state(opt))
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in moments)
    assert images.shape == (16, 8, 8, 3) and images.dtype == jnp.bfloat16
    assert labels.sharding == NamedSharding(mesh, P("data"))
    _, _, tp_images, _ = n10.train_inputs(model, optimizer, "tp", 16, (8, 8, 3))
    assert dict(tp_images.sharding.mesh.shape) == {"data": 4, "model": 2}
    assert n10.count_params(model) == 2 * 16 * 64


def test_report_readers() -> None:
    remat = report("remat_mlp")
    assert n10.gradient_all_reduce_bytes(remat) == 3 * 2 * 128 * 512 * 2  # bf16 gradients
    assert n10.bound_term(remat) in n10.BOUND_TERMS
    assert n10.bound_term(remat) == "floors"  # 49 kernels of tiny products
    rows = n10.strategy_rows({"remat": remat})
    assert rows[0]["collectives"] == "2 all-reduce" and rows[0]["step us"] == "49-61"


def test_check_sync_all_reduces() -> None:
    scan = report("scan_mlp")  # one synchronous all-reduce (the loss)
    assert n10.check_sync_all_reduces(1, scan).passed
    wrong = n10.check_sync_all_reduces(2, scan)
    assert not wrong.passed and wrong.attempted and "mode sync" in wrong.message
    assert not n10.check_sync_all_reduces(..., scan).attempted
    # the hint's expression runs with the notebook's names and gives the checker's count
    assert n10.SYNC_HINT in wrong.message
    assert eval(n10.SYNC_HINT, {}, {"reports": {"tp": scan}}) == 1


def test_check_gradient_bytes() -> None:
    model, _ = abstract_tiny()
    assert n10.check_gradient_bytes(2 * 3 * 2048 // 4 * 2, model).passed  # 2 (n-1)/n x 2 B
    assert n10.check_gradient_bytes(2 * 7 * 2048 // 8 * 2, model, gpus=8).passed
    f32 = n10.check_gradient_bytes(2 * 3 * 2048 // 4 * 4, model)
    assert not f32.passed and "float32" in f32.message
    plain = n10.check_gradient_bytes(2 * 2048, model)
    assert not plain.passed and "sends more" in plain.message
    loss = n10.check_gradient_bytes(round(2 * 3 * (2 * 2048 + 4) / 4), model)
    assert not loss.passed and "loss" in loss.message
    assert not n10.check_gradient_bytes(7, model).passed
    assert not n10.check_gradient_bytes(None, model).attempted


def test_check_argument_ratio() -> None:
    dp, fsdp = report("remat_mlp", argument=4200), report("scan_mlp", argument=1000)
    assert n10.argument_ratio(dp, fsdp) == 4.2
    right = n10.check_argument_ratio(4.1, dp, fsdp)  # within 5%
    assert right.passed and right.exercise == "10.3" and "4.20x" in right.message
    wrong = n10.check_argument_ratio(8, dp, fsdp)
    assert not wrong.passed and wrong.attempted and "report_dp.memory.argument" in wrong.message
    assert not n10.check_argument_ratio("a lot", dp, fsdp).passed
    assert not n10.check_argument_ratio(..., dp, fsdp).attempted
    with pytest.raises(ValueError, match="memory section"):
        n10.argument_ratio(dataclasses.replace(dp, memory=None), fsdp)


def test_a_bf16_ring_sum_errs_more_than_one_rounding() -> None:
    errors = n10.bf16_all_reduce_error(8, size=4096)
    hops, once = errors["bf16, hop by hop"], errors["exact, rounded once"]
    assert 0 < once < 2**-8  # one rounding: within bf16's half-ulp (2^-9) on average
    assert hops > 1.5 * once  # seven roundings on the way
    two = n10.bf16_all_reduce_error(2, size=4096)  # one hop: the same single rounding
    assert two["bf16, hop by hop"] == pytest.approx(two["exact, rounded once"])


def test_model_path_finds_models_beside_the_notebook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # nothing called models/ here: the notebook's folder has it
    found = n10.model_path("models/mlp_mixer.py:train_step")
    assert found == f"{n10.NOTEBOOKS / 'models' / 'mlp_mixer.py'}:train_step"
    assert Path(n10.model_path("models/your_model.py")).is_file()
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "your_model.py").write_text("")  # the working directory's wins
    assert n10.model_path("models/your_model.py") == "models/your_model.py"
    assert n10.model_path("models/nowhere.py") == "models/nowhere.py"  # load_program says


def test_split_gradients_checker_wants_options() -> None:
    def never(*args: object) -> None:
        raise AssertionError("compiled an answer that is not a dict")

    assert not n10.check_split_gradients(..., never, None, None).attempted  # type: ignore[arg-type]
    wrong = n10.check_split_gradients(4, never, None, None)  # type: ignore[arg-type]
    assert "expected a dict" in wrong.message
