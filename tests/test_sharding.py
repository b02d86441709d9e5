"""labkit.sharding.make_mesh: meshes over this process's devices, with clear errors."""

from __future__ import annotations

import pytest
from jax.sharding import AxisType

from labkit import sharding


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
    ],
)
def test_bad_meshes_say_what_to_do(
    shape: tuple[int, ...], names: tuple[str, ...], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        sharding.make_mesh(shape, names)
