"""Training the lab's GPT: stateful Flax NNX steps, and pure functions for jit and AOT.

- stateful NNX: :func:`create_model`, :func:`make_optimizer`, :func:`train_step`;
- pure functions for ``jax.jit`` with explicit shardings and deviceless compiles:
  :func:`abstract_train_state`, :func:`init_train_state`, :func:`pure_train_step`,
  :func:`jit_train_step` and the one-call :func:`train_setup`. The state is
  ``{"params": ..., "opt_state": ...}`` of plain arrays.

A batch is always int32 ``(batch, seq_len + 1)``: inputs are ``batch[:, :-1]``, next-byte
targets are ``batch[:, 1:]`` (what :func:`labkit.gpt.data.batches` yields).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import TypedDict

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from labkit.core.mesh import abstract
from labkit.core.types import PyTree
from labkit.gpt.config import GPTConfig
from labkit.gpt.model import GPT
from labkit.parallel.sharding import (
    Strategy,
    activation_sharding,
    as_strategy,
    batch_spec,
    check_fits,
    check_mesh,
    param_specs,
)


class State(TypedDict):
    """The pure train state: plain arrays (or their ``ShapeDtypeStruct`` s)."""

    params: PyTree  # nested dict of arrays, as nnx.to_pure_dict writes it
    opt_state: optax.OptState


# ---------------------------------------------------------------------------------------
# Training, stateful NNX


def loss_fn(model: GPT, batch: jax.Array) -> jax.Array:
    """Mean next-byte cross entropy of int32 ``batch`` ``(batch, seq + 1)``."""
    inputs, targets = batch[:, :-1], batch[:, 1:]  # (batch, seq) each
    logits = model(inputs).astype(jnp.float32)  # (batch, seq, vocab)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def make_tx(lr: float = 3e-3, weight_decay: float = 0.01) -> optax.GradientTransformation:
    """The optax AdamW used by every notebook (b2 0.95 as in GPT-3 training)."""
    return optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=weight_decay)


def create_model(
    cfg: GPTConfig, mesh: Mesh | None = None, strategy: Strategy = "dp", seed: int = 0
) -> GPT:
    """A GPT with real params; with a ``mesh``, params are placed by ``strategy``."""
    if mesh is None:
        return GPT(cfg, rngs=nnx.Rngs(seed))
    check_fits(cfg.sizes(), mesh, strategy)
    abstract_model = nnx.eval_shape(lambda: GPT(cfg, rngs=nnx.Rngs(seed)))
    shardings = _named(param_specs(abstract_model, strategy, mesh), mesh)

    @nnx.jit
    def make() -> GPT:
        model = GPT(cfg, rngs=nnx.Rngs(seed))
        state = nnx.state(model)
        pure = jax.lax.with_sharding_constraint(nnx.to_pure_dict(state), shardings)
        nnx.replace_by_pure_dict(state, pure)
        nnx.update(model, state)
        return model

    return make()


def make_optimizer(model: GPT, lr: float = 3e-3) -> nnx.Optimizer[GPT]:
    """AdamW (:func:`make_tx`) over the model's ``nnx.Param`` variables.

    Moments follow their params' shardings; for a model on a mesh, the scalar step counts
    are replicated on that mesh too (else the second step recompiles for new shardings).
    """
    optimizer = nnx.Optimizer(model, make_tx(lr), wrt=nnx.Param)
    sharding = jax.tree.leaves(nnx.state(model))[0].sharding
    if isinstance(sharding, NamedSharding):
        replicated = NamedSharding(sharding.mesh, PartitionSpec())
        state = jax.tree.map(
            lambda x: x if isinstance(x.sharding, NamedSharding) else jax.device_put(x, replicated),
            nnx.state(optimizer),
        )
        nnx.update(optimizer, state)
    return optimizer


def make_train_step(
    mesh: Mesh | None = None, strategy: Strategy | None = None
) -> Callable[[GPT, nnx.Optimizer[GPT], jax.Array], jax.Array]:
    """An ``nnx.jit`` train step; with ``mesh`` and ``strategy`` activations are pinned too."""
    if mesh is not None:
        check_mesh(as_strategy(strategy), mesh)

    @nnx.jit
    def step(model: GPT, optimizer: nnx.Optimizer[GPT], batch: jax.Array) -> jax.Array:
        layout: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if mesh is not None:
            layout = activation_sharding(mesh, as_strategy(strategy))
        with layout:
            loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
        optimizer.update(model, grads)
        return loss

    return step


_train_step = make_train_step()


def train_step(model: GPT, optimizer: nnx.Optimizer[GPT], batch: jax.Array) -> jax.Array:
    """One jitted AdamW step on ``batch`` (batch, seq + 1); updates in place, returns the loss."""
    return _train_step(model, optimizer, batch)


# ---------------------------------------------------------------------------------------
# Training, pure functions (jax.jit with explicit shardings, deviceless compiles)


def _named(specs: PyTree, mesh: Mesh) -> PyTree:
    return jax.tree.map(
        lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, PartitionSpec)
    )


def abstract_train_state(
    cfg: GPTConfig,
    mesh: Mesh,
    strategy: Strategy,
    batch_size: int,
    tx: optax.GradientTransformation | None = None,
) -> tuple[nnx.GraphDef[GPT], State, jax.ShapeDtypeStruct]:
    """``(graphdef, state, batch)`` as sharded ``ShapeDtypeStruct`` s; nothing is allocated.

    Optimizer moments get their parameter's sharding; scalars (the step count) replicate.
    """
    tx = make_tx() if tx is None else tx
    check_fits(cfg.sizes(), mesh, strategy)
    graphdef, abs_state = nnx.split(nnx.eval_shape(lambda: GPT(cfg, rngs=nnx.Rngs(0))))
    specs = param_specs(abs_state, strategy, mesh)
    params = abstract(nnx.to_pure_dict(abs_state), mesh, specs)
    opt_shapes = jax.eval_shape(tx.init, params)
    opt_specs = optax.tree_map_params(
        tx,
        lambda _, s: s,
        opt_shapes,
        specs,
        transform_non_params=lambda _: PartitionSpec(),
        is_leaf=lambda s: isinstance(s, PartitionSpec),
    )
    opt_state = abstract(opt_shapes, mesh, opt_specs)
    bspec = batch_spec(strategy, mesh)
    if bspec[0] is not None and batch_size % mesh.shape[bspec[0]]:
        raise ValueError(
            f"batch_size {batch_size} does not divide by mesh axis {bspec[0]!r} "
            f"of size {mesh.shape[bspec[0]]}"
        )
    batch = abstract(jax.ShapeDtypeStruct((batch_size, cfg.seq_len + 1), jnp.int32), mesh, bspec)
    return graphdef, {"params": params, "opt_state": opt_state}, batch


def pure_train_step(
    graphdef: nnx.GraphDef[GPT],
    tx: optax.GradientTransformation,
    mesh: Mesh | None = None,
    strategy: Strategy | None = None,
) -> Callable[[State, jax.Array], tuple[State, jax.Array]]:
    """A pure ``step(state, batch) -> (new_state, loss)`` to wrap in ``jax.jit``.

    With ``mesh`` and ``strategy``, activations are pinned by :func:`activation_sharding`.
    """
    if mesh is not None:
        check_mesh(as_strategy(strategy), mesh)

    def step(state: State, batch: jax.Array) -> tuple[State, jax.Array]:
        def loss_of(params: PyTree) -> jax.Array:
            return loss_fn(nnx.merge(graphdef, nnx.State(params)), batch)

        layout: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if mesh is not None:
            layout = activation_sharding(mesh, as_strategy(strategy))
        with layout:
            loss, grads = jax.value_and_grad(loss_of)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state}, loss

    return step


def shardings_of(abstract_tree: PyTree) -> PyTree:
    """The ``.sharding`` of every leaf of a ShapeDtypeStruct (or array) tree."""
    return jax.tree.map(lambda a: a.sharding, abstract_tree)


# XLA:CPU hands dots and reductions to YNNPACK by default. A YNNPACK reduction fusion takes
# its operands as whole arrays, so every broadcast feeding one (LayerNorm's scale, softmax's
# 1/sum) is first written out in full: 20 such copies in the small GPT's step, about a tenth
# of its time. Without the reduction type XLA's own emitters do the reductions and fuse the
# broadcasts; dots stay with YNNPACK. Same work, same loss; `make bench` measures it.
# (The default lists LIBRARY_FUSION_TYPE_REDUCE too; tests/test_compile.py checks that.)
CPU_STEP_OPTIONS: dict[str, str] = {
    "xla_cpu_experimental_ynn_fusion_type": (
        "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION"
    )
}


def jit_train_step(
    graphdef: nnx.GraphDef[GPT],
    abstract_state: State,
    abstract_batch: jax.ShapeDtypeStruct,
    strategy: Strategy,
    tx: optax.GradientTransformation | None = None,
) -> jax.stages.Wrapped:
    """:func:`pure_train_step` under ``jax.jit`` with the abstract inputs' shardings.

    The state is donated and keeps its sharding from step to step; the loss is replicated.
    ``.lower(abstract_state, abstract_batch)`` works, so it goes to
    ``labkit.xla.aot.compile_for_gpu`` as it is. On CPU devices it compiles with
    :data:`CPU_STEP_OPTIONS`.
    """
    tx = make_tx() if tx is None else tx
    state_shardings = shardings_of(abstract_state)
    mesh = abstract_batch.sharding.mesh
    on_cpu = mesh.devices.flat[0].platform == "cpu"
    return jax.jit(
        pure_train_step(graphdef, tx, mesh, strategy),
        in_shardings=(state_shardings, abstract_batch.sharding),
        out_shardings=(state_shardings, NamedSharding(mesh, PartitionSpec())),
        donate_argnums=0,
        compiler_options=CPU_STEP_OPTIONS if on_cpu else None,
    )


def init_train_state(
    cfg: GPTConfig,
    abstract_state: State,
    tx: optax.GradientTransformation | None = None,
    seed: int = 0,
) -> State:
    """Real params and optimizer state, created directly in ``abstract_state``'s shardings."""
    tx = make_tx() if tx is None else tx

    def init() -> State:
        params = nnx.to_pure_dict(nnx.state(GPT(cfg, rngs=nnx.Rngs(seed))))
        return {"params": params, "opt_state": tx.init(params)}

    return jax.jit(init, out_shardings=shardings_of(abstract_state))()


def train_setup(
    cfg: GPTConfig,
    mesh: Mesh,
    strategy: Strategy = "dp",
    batch_size: int = 32,
    tx: optax.GradientTransformation | None = None,
) -> tuple[jax.stages.Wrapped, State, jax.ShapeDtypeStruct]:
    """``(step, abstract_state, abstract_batch)``: a jitted step ready to compile or run.

    With the default optimizer (``tx=None``) the result is cached per process on
    ``(cfg, mesh, strategy, batch_size)``: tracing the model once serves every compile of it.
    """
    if tx is None:
        return _default_setup(cfg, mesh, strategy, batch_size)
    graphdef, state, batch = abstract_train_state(cfg, mesh, strategy, batch_size, tx)
    return jit_train_step(graphdef, state, batch, strategy, tx), state, batch


@functools.lru_cache(maxsize=16)
def _default_setup(
    cfg: GPTConfig, mesh: Mesh, strategy: Strategy, batch_size: int
) -> tuple[jax.stages.Wrapped, State, jax.ShapeDtypeStruct]:
    return train_setup(cfg, mesh, strategy, batch_size, make_tx())


def timing_state(abstract: PyTree, seed: int = 0) -> PyTree:
    """Arrays of ``abstract``'s shapes and shardings: small random floats, integer zeros.

    Placing host arrays skips compiling the model's initialiser (seconds on CPU); the
    values are only fit for timing a step.
    """
    rng = np.random.default_rng(seed)

    def one(a: jax.ShapeDtypeStruct) -> jax.Array:
        if np.issubdtype(a.dtype, np.floating):
            value = (0.02 * rng.standard_normal(a.shape)).astype(a.dtype)
        else:
            value = np.zeros(a.shape, a.dtype)
        return jax.device_put(value, a.sharding)

    return jax.tree.map(one, abstract)


def count_params(tree: PyTree) -> int:
    """Total number of elements in the arrays (or ShapeDtypeStructs) of ``tree``."""
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))
