"""parallel.placement: fitting specs to shapes and the batch specs, on 8 fake CPU devices."""

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from longrm_jax.parallel.mesh import make_mesh
from longrm_jax.parallel.placement import batch_spec, divisible_axes, fit_spec, place_batch


def test_fit_spec_replicates_a_dimension_its_axes_do_not_divide():
    mesh = make_mesh(data=2, fsdp=4)
    spec = P(("data", "fsdp"), "fsdp", None)
    assert fit_spec(spec, (8, 4, 3), mesh) == P(("data", "fsdp"), "fsdp", None)
    assert fit_spec(spec, (2, 6, 3), mesh) == P(None, None, None)
    assert fit_spec(P("fsdp"), (4, 5), mesh) == P("fsdp", None)  # missing trailing dims are replicated
    assert fit_spec(spec, (1, 1, 1), None) is spec


def test_divisible_axes_keeps_each_axis_that_divides():
    mesh = make_mesh(data=2, fsdp=2, seq=2)
    assert divisible_axes(mesh, ("data", "fsdp"), 4) == ("data", "fsdp")
    assert divisible_axes(mesh, ("data", "fsdp"), 2) == "data"
    assert divisible_axes(mesh, ("data", "fsdp", "seq"), 8, exclude=("seq",)) == ("data", "fsdp")
    assert divisible_axes(mesh, ("tensor",), 8) is None  # size 1


def test_batch_placement():
    assert batch_spec(1) == P(("data", "fsdp"))
    assert batch_spec(2) == P(("data", "fsdp"), "seq")
    assert batch_spec(3, slotted=True) == P(("data", "fsdp"), None, "seq")
    mesh = make_mesh(data=2, fsdp=2, seq=2)
    x = place_batch(np.arange(32, dtype=np.int32).reshape(4, 8), mesh)
    assert x.sharding.spec == P(("data", "fsdp"), "seq")
    np.testing.assert_array_equal(jax.device_get(x), np.arange(32).reshape(4, 8))
