"""Parallelism that knows no model and no kernel: meshes, logical sharding rules, placement on a mesh, and
the zigzag token order that ring attention (``longrm_jax.ops.ring``) expects."""

from longrm_jax.parallel.mesh import DEFAULT_RULES, MESH_AXES, logical_to_spec, make_mesh, named_sharding
from longrm_jax.parallel.placement import BATCH_AXES, batch_spec, fit_spec, place_batch, place_process_rows
from longrm_jax.parallel.zigzag import (
    zigzag_inverse_permutation,
    zigzag_permutation,
    zigzag_reorder,
    zigzag_restore,
)

__all__ = [
    "BATCH_AXES",
    "DEFAULT_RULES",
    "MESH_AXES",
    "batch_spec",
    "fit_spec",
    "logical_to_spec",
    "make_mesh",
    "named_sharding",
    "place_batch",
    "place_process_rows",
    "zigzag_inverse_permutation",
    "zigzag_permutation",
    "zigzag_reorder",
    "zigzag_restore",
]
