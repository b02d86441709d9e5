"""labkit.parallel.sharding's byte formulas, per-device memory, strategy choice and layout grids."""

from __future__ import annotations

import jax
import pytest
from jax.sharding import PartitionSpec as P

from labkit.parallel import sharding

# A toy model by logical names: (names, shape, itemsize).
PARAMS: sharding.Params = {
    "embed": (("vocab", "embed"), (256, 64), 4),
    "up": (("embed", "mlp"), (64, 256), 4),
    "scale": (("embed",), (64,), 4),
    "free": ((None,), (10,), 4),
}
HLO_ONE_ALL_REDUCE = """\
HloModule m, num_partitions=8

ENTRY %main (a: f32[1024]) -> f32[1024] {
  %a = f32[1024]{0} parameter(0)
  ROOT %r = f32[1024]{0} all-reduce(%a), replica_groups=[4,2]<=[8], to_apply=%add
}
"""


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("all-reduce", 1750.0),
        ("all-gather", 875.0),
        ("reduce-scatter", 875.0),
        ("all-to-all", 875.0),
        ("collective-permute", 1000.0),
    ],
)
def test_ring_bytes_formulas(kind: str, expected: float) -> None:
    assert sharding.ring_bytes(kind, 1000, 8) == pytest.approx(expected)
    assert sharding.ring_bytes(kind, 1000, 1) == 0.0  # alone: nothing to send


def test_ring_bytes_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="unknown collective kind"):
        sharding.ring_bytes("all-sum", 8, 2)
    with pytest.raises(ValueError, match="group size"):
        sharding.ring_bytes("all-reduce", 8, 0)
    with pytest.raises(ValueError, match=">= 0"):
        sharding.ring_bytes("all-reduce", -1, 2)


def test_shard_shape_and_axis_size() -> None:
    sizes = {"data": 4, "model": 2}
    assert sharding.shard_shape((16, 32), P("data", "model"), sizes) == (4, 16)
    assert sharding.shard_shape((16, 32), P(("data", "model")), sizes) == (2, 32)
    assert sharding.shard_shape((16, 32), P(), sizes) == (16, 32)
    assert sharding.axis_size(None, sizes) == 1
    with pytest.raises(ValueError, match="does not divide"):
        sharding.shard_shape((6, 32), P("data"), sizes)
    with pytest.raises(ValueError, match="not in the mesh"):
        sharding.shard_shape((16,), P("pipe"), sizes)
    with pytest.raises(ValueError, match="more entries"):
        sharding.shard_shape((16,), P("data", None), sizes)


def test_param_bytes_per_device() -> None:
    total = 256 * 64 * 4 + 64 * 256 * 4 + 64 * 4 + 40
    assert sharding.param_bytes_per_device(PARAMS, "dp", {"data": 8}) == total
    fsdp = sharding.param_bytes_per_device(PARAMS, "fsdp", {"data": 8})
    assert fsdp == (256 * 64 * 4 + 64 * 256 * 4 + 64 * 4) // 8 + 40
    tp = sharding.param_bytes_per_device(PARAMS, "tp", {"data": 4, "model": 2})
    assert tp == 256 * 64 * 4 + 64 * 256 * 4 // 2 + 64 * 4 + 40
    with pytest.raises(ValueError, match="needs mesh axes"):
        sharding.param_bytes_per_device(PARAMS, "tp", {"data": 8})


def test_gradient_sync_bytes_dp_equals_fsdp() -> None:
    dp = sharding.gradient_sync_bytes(PARAMS, "dp", {"data": 8})
    total = sharding.param_bytes_per_device(PARAMS, "dp", {"data": 8})
    assert dp == {"all-reduce": pytest.approx(2 * 7 / 8 * total)}
    fsdp = sharding.gradient_sync_bytes(PARAMS, "fsdp", {"data": 8})
    assert set(fsdp) == {"all-reduce", "all-gather", "reduce-scatter"}  # "free" has no embed
    assert fsdp["all-gather"] == fsdp["reduce-scatter"]
    assert sum(fsdp.values()) == pytest.approx(sum(dp.values()))  # same bytes, less memory


def test_gradient_sync_bytes_tp_and_single_device() -> None:
    tp = sharding.gradient_sync_bytes(PARAMS, "tp", {"data": 4, "model": 2})
    local = sharding.param_bytes_per_device(PARAMS, "tp", {"data": 4, "model": 2})
    assert tp == {"all-reduce": pytest.approx(2 * 3 / 4 * local)}
    assert sharding.gradient_sync_bytes(PARAMS, "tp", {"model": 2}) == {}  # no data axis


def test_hlo_ring_bytes_reads_group_size() -> None:
    assert sharding.hlo_ring_bytes(HLO_ONE_ALL_REDUCE) == {"all-reduce": 4096.0}  # 2*(1/2)*4096


def test_choose_strategy() -> None:
    candidates = {"dp": (100.0, 800.0), "fsdp": (100.0, 100.0), "tp": (150.0, 400.0)}
    assert sharding.choose_strategy(candidates) == "fsdp"  # a tie goes to less memory
    assert sharding.choose_strategy({**candidates, "dp": (90.0, 800.0)}) == "dp"
    assert sharding.choose_strategy({k: candidates[k] for k in ("dp", "tp")}, 500) == "tp"
    with pytest.raises(ValueError, match=r"no strategy fits 50 .* 'fsdp'"):
        sharding.choose_strategy(candidates, memory_limit=50)
    with pytest.raises(ValueError, match="no candidate"):
        sharding.choose_strategy({}, memory_limit=50)


def test_layout_grid() -> None:
    mesh = {"data": 4, "model": 2}
    grid = sharding.layout_grid((16, 32), P("data", "model"), mesh)
    assert grid == [[(0,), (1,)], [(2,), (3,)], [(4,), (5,)], [(6,), (7,)]]
    rows = sharding.layout_grid((16, 32), P("data", None), mesh)
    assert rows == [[(0, 1)], [(2, 3)], [(4, 5)], [(6, 7)]]  # copies along "model"
    cols = sharding.layout_grid((16, 32), P(None, "data"), mesh)
    assert cols == [[(0, 1), (2, 3), (4, 5), (6, 7)]]
    both = sharding.layout_grid((16, 32), P(("model", "data")), mesh)
    assert [cell for row in both for cell in row] == [
        (0,),
        (2,),
        (4,),
        (6,),
        (1,),
        (3,),
        (5,),
        (7,),
    ]
    assert sharding.layout_grid((4, 4), P(), mesh) == [[tuple(range(8))]]
    text = sharding.layout_text(rows)
    assert text.splitlines()[1] == "| 0,1 |" and text.count("+") == 10
    with pytest.raises(ValueError, match="2-D"):
        sharding.layout_grid((4,), P(), mesh)
    with pytest.raises(ValueError, match="twice"):
        sharding.layout_grid((16, 32), P("data", "data"), mesh)


def test_layout_grid_matches_jax() -> None:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding

    from labkit.core.mesh import make_mesh

    mesh = make_mesh((2, 4), ("a", "b"))
    for spec in (P("a", "b"), P("b", None), P(None, ("a", "b")), P("b", "a")):
        x = jax.device_put(jnp.zeros((8, 16)), NamedSharding(mesh, spec))
        grid = sharding.layout_grid((8, 16), spec, {"a": 2, "b": 4})
        bh, bw = 8 // len(grid), 16 // len(grid[0])
        for shard in x.addressable_shards:
            i, j = (shard.index[0].start or 0) // bh, (shard.index[1].start or 0) // bw
            assert shard.device.id in grid[i][j], (spec, shard.device.id, grid)


def test_strategy_mesh_on_cpu_devices() -> None:
    cpu = jax.devices("cpu")
    assert dict(sharding.strategy_mesh("tp", cpu).shape) == {"data": 4, "model": 2}
    assert dict(sharding.strategy_mesh("dp", cpu[:4]).shape) == {"data": 4}
    assert dict(sharding.strategy_mesh("tp", cpu[:4]).shape) == {"data": 2, "model": 2}
    assert dict(sharding.strategy_mesh("tp", cpu[:1]).shape) == {"data": 1, "model": 1}
    with pytest.raises(ValueError, match="choose one of"):
        sharding.strategy_mesh("pp", cpu)


def test_array_grid_and_layout_picture_read_the_arrays_sharding() -> None:
    import jax.numpy as jnp
    from jax.sharding import NamedSharding

    from labkit.core.mesh import make_mesh

    mesh = make_mesh((4, 2), ("data", "model"))
    for spec in (P("data", "model"), P(None, "model"), P(("data", "model"))):
        shape = (16, 32) if len(spec) != 1 else (16, 8)
        x = jax.device_put(jnp.zeros(shape), NamedSharding(mesh, spec))
        assert sharding.array_grid(x) == sharding.layout_grid(shape, spec, dict(mesh.shape))
    line = jax.device_put(jnp.zeros(16), NamedSharding(mesh, P("data")))
    assert sharding.array_grid(line) == [[(0, 1), (2, 3), (4, 5), (6, 7)]]  # one row of blocks
    x = jax.device_put(jnp.zeros((16, 32)), NamedSharding(mesh, P("data", None)))
    shown = sharding.layout_picture(x, "x")
    assert shown.title == "How x is laid out"
    assert shown.svg.count('class="labkit-block"') == 4
    assert "x (16, 32) float32, P('data', None): 4 x 1 blocks, each on 2 device(s)" in (
        shown.caption
    )
    assert shown.caption.startswith("Mesh {'data': 4, 'model': 2}, 8 devices.")
    assert " p0" not in shown.svg  # one process: no process labels
    with pytest.raises(ValueError, match="1-D and 2-D"):
        sharding.array_grid(jax.device_put(jnp.zeros((8, 2, 2)), NamedSharding(mesh, P("data"))))


def test_show_prints_the_layout_outside_jupyter(capsys: pytest.CaptureFixture[str]) -> None:
    import jax.numpy as jnp
    from jax.sharding import NamedSharding

    from labkit.core.mesh import make_mesh

    mesh = make_mesh((8,), ("x",))
    sharding.show(jax.device_put(jnp.zeros((8, 4)), NamedSharding(mesh, P("x"))), "a")
    out = capsys.readouterr().out
    assert out.startswith("How a is laid out\na (8, 4) float32, P('x',):\n[0]\n[1]\n")
