"""The GPT: shapes, size, FLOPs, numerics, sharding rules, sharded training, H100 compiles."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from labkit.core.mesh import make_mesh
from labkit.gpt import data, train
from labkit.gpt.config import GPTConfig, flops_per_token, param_count
from labkit.gpt.model import GPT
from labkit.parallel import sharding
from labkit.xla import aot
from labkit.xla.hlo import collective_counts

P = PartitionSpec
TINY = GPTConfig.tiny()
# Smaller still for the multi-device tests: compile time on 2 cores grows with layers.
MINI = GPTConfig.tiny(num_layers=1, seq_len=32, d_ff=128)


@nnx.jit
def forward(model: GPT, tokens: jax.Array) -> jax.Array:
    return model(tokens)


def auto_mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> jax.sharding.Mesh:
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))


@pytest.fixture(scope="module")
def corpus_tokens() -> np.ndarray:
    return data.encode(data.corpus(300_000))


def random_batch(cfg: GPTConfig, batch_size: int = 4, seed: int = 0) -> jax.Array:
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.integers(0, cfg.vocab_size, (batch_size, cfg.seq_len + 1)), jnp.int32)


# --- config -------------------------------------------------------------------------------


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="divisible by num_heads"):
        GPTConfig(d_model=64, num_heads=5)
    with pytest.raises(ValueError, match="num_layers must be a positive int"):
        GPTConfig(num_layers=0)
    with pytest.raises(ValueError, match="float dtype"):
        GPTConfig(dtype=jnp.int32)
    with pytest.raises(ValueError, match="dot_general must be callable"):
        GPTConfig(dot_general="fp8")
    with pytest.raises(ValueError, match="unknown GPT preset"):
        GPTConfig.preset("huge")
    assert GPTConfig.small(num_layers=3).num_layers == 3
    assert TINY.head_dim == TINY.d_model // TINY.num_heads


# --- model --------------------------------------------------------------------------------


@pytest.mark.parametrize("tie", [False, True])
def test_shapes_and_param_count(tie: bool) -> None:
    cfg = GPTConfig.tiny(tie_embeddings=tie)
    model = train.create_model(cfg)
    logits = forward(model, random_batch(cfg)[:, :-1])
    assert logits.shape == (4, cfg.seq_len, 256)
    assert train.count_params(nnx.state(model, nnx.Param)) == param_count(cfg)
    assert (model.head is None) == tie
    with pytest.raises(ValueError, match="seq <= seq_len"):
        model(jnp.zeros((1, cfg.seq_len + 1), jnp.int32))


def test_flops_per_token_formula_and_xla_count() -> None:
    cfg = GPTConfig.small()
    n = cfg.num_layers * (4 * 128**2 + 2 * 128 * 512) + 128 * 256
    assert flops_per_token(cfg) == 6 * n + 12 * 2 * 128 * 128
    # XLA's own count for a whole train step agrees with 6N + 12LTd within a few percent.
    graphdef, state, batch = train.abstract_train_state(
        cfg, auto_mesh((1,), ("data",)), "dp", batch_size=8
    )
    compiled = jax.jit(train.pure_train_step(graphdef, train.make_tx())).lower(state, batch)
    xla_flops = compiled.compile().cost_analysis()["flops"]
    ratio = xla_flops / (flops_per_token(cfg) * 8 * cfg.seq_len)
    assert 0.95 < ratio < 1.1, ratio


def test_loss_starts_uniform_and_falls_on_the_corpus(corpus_tokens: np.ndarray) -> None:
    model = train.create_model(TINY)
    optimizer = train.make_optimizer(model, lr=3e-3)
    batches = data.batches(corpus_tokens, batch_size=8, seq_len=TINY.seq_len, steps=30)
    losses = [float(train.train_step(model, optimizer, jnp.asarray(b))) for b in batches]
    assert abs(losses[0] - math.log(256)) < 0.05, losses[0]  # near-uniform over 256 bytes
    assert np.mean(losses[-5:]) < losses[0] - 1.5, losses
    assert int(optimizer.step[...]) == 30


def test_bf16_compute_dtype() -> None:
    cfg = GPTConfig.tiny(dtype=jnp.bfloat16)
    model = train.create_model(cfg)
    logits = forward(model, random_batch(cfg)[:, :-1])
    assert logits.dtype == jnp.bfloat16
    hidden = nnx.jit(lambda mlp, x: mlp(x))(model.blocks[0].mlp, jnp.ones((2, 8, cfg.d_model)))
    assert hidden.dtype == jnp.bfloat16  # f32 input, bf16 compute and output
    assert model.blocks[0].mlp.up.kernel[...].dtype == jnp.float32  # param_dtype unchanged
    assert np.isfinite(float(nnx.jit(train.loss_fn)(model, random_batch(cfg))))


@pytest.mark.parametrize("tie", [False, True])
def test_dot_general_hook_is_called(tie: bool) -> None:
    calls = []

    def counting_dot_general(lhs, rhs, dimension_numbers, *args, **kwargs):
        calls.append((lhs.shape, rhs.shape))
        return jax.lax.dot_general(lhs, rhs, dimension_numbers, *args, **kwargs)

    cfg = GPTConfig.tiny(dot_general=counting_dot_general, tie_embeddings=tie)
    model = train.create_model(cfg)
    forward(model, random_batch(cfg)[:, :-1])  # traced once: one call per projection
    # q, k, v, o, MLP up and down in every layer, plus the vocab head unless tied
    assert len(calls) == 6 * cfg.num_layers + (0 if tie else 1)
    assert (cfg.d_model, cfg.d_ff) in [rhs for _, rhs in calls]


# --- sharding rules -----------------------------------------------------------------------


def test_param_specs_follow_the_rules() -> None:
    abstract = nnx.eval_shape(lambda: GPT(TINY, rngs=nnx.Rngs(0)))
    dp = sharding.param_specs(abstract, "dp")
    fsdp = sharding.param_specs(abstract, "fsdp")
    tp = sharding.param_specs(abstract, "tp")
    fsdp_tp = sharding.param_specs(abstract, "fsdp_tp")
    assert all(s == P(*[None] * len(s)) for s in jax.tree.leaves(dp, is_leaf=_is_spec))
    blk = {
        name: specs["blocks"][0] for name, specs in [("fsdp", fsdp), ("tp", tp), ("2d", fsdp_tp)]
    }
    assert blk["fsdp"]["attn"]["q"]["kernel"] == P("data", None)
    assert blk["fsdp"]["attn"]["o"]["kernel"] == P(None, "data")
    assert blk["fsdp"]["ln1"]["scale"] == P("data")
    assert fsdp["tok_embed"]["embedding"] == P(None, "data")
    assert blk["tp"]["attn"]["q"]["kernel"] == P(None, "model")
    assert blk["tp"]["attn"]["o"]["kernel"] == P("model", None)
    assert blk["tp"]["mlp"]["up"]["kernel"] == P(None, "model")
    assert blk["tp"]["mlp"]["down"]["kernel"] == P("model", None)
    assert blk["tp"]["ln2"]["bias"] == P(None)
    assert blk["2d"]["mlp"]["up"]["kernel"] == P("data", "model")
    assert blk["2d"]["mlp"]["down"]["kernel"] == P("model", "data")
    assert sharding.batch_spec("dp") == P("data", None)
    assert sharding.batch_spec("tp", auto_mesh((8,), ("model",))) == P(None, None)
    assert sharding.batch_spec("tp", auto_mesh((4, 2), ("data", "model"))) == P("data", None)


def _is_spec(x: object) -> bool:
    return isinstance(x, PartitionSpec)


def test_bad_strategy_mesh_and_sizes_raise() -> None:
    with pytest.raises(ValueError, match="unknown sharding strategy 'zero3'"):
        sharding.batch_spec("zero3")
    data_only = auto_mesh((8,), ("data",))
    with pytest.raises(ValueError, match=r"needs mesh axes \('model',\).*missing \('model',\)"):
        train.abstract_train_state(TINY, data_only, "tp", batch_size=8)
    with pytest.raises(ValueError, match="missing"):
        train.create_model(TINY, data_only, "fsdp_tp")
    with pytest.raises(ValueError, match="'heads' \\(4\\) over mesh axis 'model' of size 8"):
        train.abstract_train_state(TINY, auto_mesh((8,), ("model",)), "tp", batch_size=8)
    with pytest.raises(ValueError, match="batch_size 6"):
        train.abstract_train_state(TINY, data_only, "dp", batch_size=6)


# --- sharded training on 8 CPU devices ----------------------------------------------------


def test_sharded_training_matches_unsharded() -> None:
    mesh = auto_mesh((4, 2), ("data", "model"))
    batches = [random_batch(MINI, batch_size=8, seed=s) for s in range(3)]

    model = train.create_model(MINI)
    optimizer = train.make_optimizer(model)
    reference = [float(train.train_step(model, optimizer, b)) for b in batches]

    step, abstract_state, abstract_batch = train.train_setup(MINI, mesh, "fsdp_tp", 8)
    state = train.init_train_state(MINI, abstract_state)
    kernel = state["params"]["blocks"][0]["mlp"]["up"]["kernel"]
    assert kernel.sharding.spec == P("data", "model")
    assert kernel.addressable_shards[0].data.shape == (MINI.d_model // 4, MINI.d_ff // 2)
    pure = []
    for b in batches:
        state, loss = step(state, jax.device_put(b, abstract_batch.sharding))
        pure.append(float(loss))
    np.testing.assert_allclose(pure, reference, atol=1e-5)
    mu = state["opt_state"][0].mu["blocks"][0]["attn"]["o"]["kernel"]
    assert mu.sharding.spec == P("model", "data")  # moments follow their params

    sharded = train.create_model(MINI, mesh, "fsdp_tp")
    assert sharded.blocks[0].attn.q.kernel[...].sharding.spec == P("data", "model")
    opt = train.make_optimizer(sharded)
    nnx_step = train.make_train_step(mesh, "fsdp_tp")
    batch_sharding = jax.NamedSharding(mesh, sharding.batch_spec("fsdp_tp", mesh))
    stateful = [float(nnx_step(sharded, opt, jax.device_put(b, batch_sharding))) for b in batches]
    np.testing.assert_allclose(stateful, reference, atol=1e-5)


# --- deviceless H100 compiles -------------------------------------------------------------


@pytest.mark.aot
def test_h100_compile_dp_and_fsdp() -> None:
    mesh = aot.h100_mesh((8,), ("data",))
    # cuBLAS instead of Triton GEMMs: the same collectives, compiled in half the time.
    options = {"xla_gpu_enable_triton_gemm": False}

    step, state, batch = train.train_setup(MINI, mesh, "dp", batch_size=16)
    dp = collective_counts(aot.compile_for_gpu(step, state, batch, compiler_options=options).hlo)
    assert dp["all-reduce"] >= 1  # the gradient all-reduce
    assert "all-gather" not in dp and "reduce-scatter" not in dp

    step, state, batch = train.train_setup(MINI, mesh, "fsdp", batch_size=16)
    hlo = aot.compile_for_gpu(step, state, batch, compiler_options=options).hlo
    fsdp = collective_counts(hlo)
    assert fsdp["all-gather"] >= 1  # params gathered before use
    assert fsdp["reduce-scatter"] >= 1  # gradients scattered back to their shards


def test_scan_layers_stacks_params_on_a_layers_axis() -> None:
    cfg = GPTConfig.tiny(scan_layers=True, num_layers=3)
    model = train.create_model(cfg)
    assert model.blocks.mlp.up.kernel.shape == (3, cfg.d_model, cfg.d_ff)
    assert train.count_params(nnx.state(model, nnx.Param)) == param_count(cfg)
    specs = sharding.param_specs(model, "fsdp_tp")
    assert specs["blocks"]["mlp"]["up"]["kernel"] == P(None, "data", "model")  # "layers" first
    batch = random_batch(cfg)
    hlo = jax.jit(lambda m, b: train.loss_fn(m, b)).lower(model, batch).as_text()
    assert "stablehlo.while" in hlo  # one block body in a loop, not 3 unrolled copies
    assert abs(float(nnx.jit(train.loss_fn)(model, batch)) - math.log(256)) < 0.05


def test_timing_state_shapes_and_shardings() -> None:
    mesh = make_mesh((8,), ("x",))
    tree = {
        "w": jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=NamedSharding(mesh, P("x"))),
        "n": jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, P())),
    }
    state = train.timing_state(tree)
    assert state["w"].shape == (8, 4) and state["w"].sharding.spec == P("x")
    assert int(state["n"]) == 0 and float(jnp.abs(state["w"]).max()) < 1
