"""labkit.core.mesh: the one mesh builder (local or compile-only devices), clear errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from labkit.core import mesh as sharding


def test_auto_mesh_over_all_devices() -> None:
    mesh = sharding.make_mesh((4, 2), ("data", "model"))
    assert dict(mesh.shape) == {"data": 4, "model": 2}
    assert mesh.axis_types == (AxisType.Auto, AxisType.Auto)
    assert sharding.make_mesh((8,), ("data",), explicit=True).axis_types == (AxisType.Explicit,)


@pytest.mark.parametrize(
    ("shape", "names", "match"),
    [
        ((4, 4), ("data", "model"), r"mesh \(4, 4\) needs 16 devices, found 8.*cpu_devices=16"),
        ((2, 2), ("data", "model"), "needs 4 devices, found 8"),
        ((8,), ("data", "model"), "differ in length"),
        ((0, 8), ("data", "model"), "smaller than 1"),
        ((4, 2), ("data", "data"), "repeat a name"),
    ],
)
def test_bad_meshes_say_what_to_do(
    shape: tuple[int, ...], names: tuple[str, ...], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        sharding.make_mesh(shape, names)


@pytest.mark.parametrize(("shape", "names"), [(8, "x"), ((8,), "x"), (8, ("x",))])
def test_a_bare_size_or_name_says_to_pass_tuples(shape: object, names: object) -> None:
    with pytest.raises(TypeError, match=r"tuple of axis sizes.*make_mesh\(\(8,\), \('data',\)\)"):
        sharding.make_mesh(shape, names)  # type: ignore[arg-type]


def test_mesh_over_given_devices() -> None:
    four = jax.devices()[:4]
    mesh = sharding.make_mesh((2, 2), ("data", "model"), devices=four)
    assert set(mesh.devices.flat) == set(four)
    with pytest.raises(ValueError, match="needs 8 devices, but 4 were given"):
        sharding.make_mesh((8,), ("data",), devices=four)


def test_abstract_inputs_carry_shardings() -> None:
    mesh = sharding.make_mesh((8,), ("data",))
    x = sharding.abstract(jnp.zeros((16, 4)), mesh, P("data"))
    assert x.shape == (16, 4) and x.sharding.spec == P("data")
    tree = sharding.abstract({"a": jnp.zeros(3), "b": jnp.zeros((8, 2))}, mesh, lambda a: P())
    assert tree["b"].sharding.spec == P()
    specs = sharding.abstract([jnp.zeros(8), jnp.zeros(8)], mesh, [P("data"), P()])
    assert [s.sharding.spec for s in specs] == [P("data"), P()]
