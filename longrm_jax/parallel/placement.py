"""Fitting partition specs to shapes, and placing host batches on a mesh.

One home for the rules every caller shares: rows of a batch are split over ``BATCH_AXES`` (data x fsdp),
tokens over ``seq``; a dimension the assigned mesh axes do not divide stays replicated instead of failing
(tiny test models, a batch of one while decoding on an fsdp mesh).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from longrm_jax.parallel.mesh import logical_to_spec

BATCH_AXES = ("data", "fsdp")
SEQ_AXIS = "seq"


def _axis_names(entry) -> tuple[str, ...]:
    return (entry,) if isinstance(entry, str) else tuple(entry or ())


def fit_spec(spec: P, shape: Sequence[int], mesh) -> P:
    """``spec`` with every dimension whose size its mesh axes do not divide replicated (no-op without mesh)."""
    if mesh is None:
        return spec
    fitted = []
    for size, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        parts = 1
        for axis in _axis_names(entry):
            parts *= mesh.shape[axis]
        fitted.append(entry if size % parts == 0 else None)
    return P(*fitted)


def divisible_axes(mesh, names: Sequence[str], size: int, exclude: Sequence[str] = ()):
    """Spec entry splitting a dimension of ``size`` over as many of ``names`` (in order) as divide it.

    Axes absent from ``mesh``, of size 1, or in ``exclude`` are skipped; unlike ``fit_spec`` an axis that does
    not divide is dropped on its own and the next ones may still be used.
    """
    axes, parts = [], 1
    for name in names:
        if name in exclude or name not in mesh.axis_names or mesh.shape[name] == 1:
            continue
        if size % (parts * mesh.shape[name]) == 0:
            axes.append(name)
            parts *= mesh.shape[name]
    return None if not axes else axes[0] if len(axes) == 1 else tuple(axes)


def batch_spec(ndim: int, *, slotted: bool = False) -> P:
    """Spec of a batch array: [B] rows; [B, T] rows x tokens; slotted [B, k, T / k] rows x - x tokens."""
    if ndim == 1:
        return P(BATCH_AXES)
    return P(BATCH_AXES, None, SEQ_AXIS) if slotted else P(BATCH_AXES, SEQ_AXIS)


def place_batch(array: np.ndarray, mesh: Mesh | None, names=("batch", "seq")) -> jax.Array:
    """A host array every process holds whole, on device: logical ``names`` per dimension (rows over
    data x fsdp, tokens over seq by the default rules); without a mesh, on the default device."""
    if mesh is None:
        return jnp.asarray(array)
    spec = logical_to_spec(names[: array.ndim], mesh=mesh)
    return jax.device_put(array, NamedSharding(mesh, spec))


def place_process_rows(local: Mapping[str, np.ndarray], shardings: Mapping[str, NamedSharding]) -> dict:
    """Device arrays of the global batch from this process's rows (all rows when single-process).

    With several processes each one passes its own ``B / process_count`` rows, in process order.
    """
    if jax.process_count() == 1:
        return {k: jax.device_put(v, shardings[k]) for k, v in local.items()}
    out = {}
    for k, v in local.items():
        global_shape = (v.shape[0] * jax.process_count(),) + v.shape[1:]
        out[k] = jax.make_array_from_process_local_data(shardings[k], v, global_shape)
    return out


def on_own_rows(fn, rows: Sequence[jax.Array], shared: Sequence[jax.Array] = (), *,
                tokens_over: str | None = None) -> jax.Array:
    """``fn(*rows, *shared)`` run by each device on its own rows only, under the mesh set by ``jax.set_mesh``.

    ``rows`` are [B, ...] arrays split over ``BATCH_AXES``; ``shared`` are whole on every device of those axes;
    ``fn`` returns one [B_local, ...] array. For computations that walk the rows one by one (a ``lax.map`` over
    rows x chunks): XLA cannot split a loop's iteration axis over devices, so without this it gathers every
    row onto every device and each one walks all of them. Other mesh axes stay under the compiler's control.
    ``tokens_over`` (a mesh axis, e.g. ``seq``): the rows' second dimension is split over it too, each device
    running ``fn`` on its own tokens of its own rows ([B_local, T_local, ...]).
    Without a mesh, or when the rows divide over none of these axes, it is ``fn`` itself.
    """
    mesh = jax.sharding.get_abstract_mesh()
    axes = () if mesh.empty else tuple(a for a in BATCH_AXES if a in mesh.axis_names and mesh.shape[a] > 1)
    parts = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
    if rows[0].shape[0] % parts:
        axes = ()
    split_tokens = (not mesh.empty and tokens_over in mesh.axis_names and mesh.shape[tokens_over] > 1
                    and rows[0].shape[1] % mesh.shape[tokens_over] == 0)
    if not axes and not split_tokens:
        return fn(*rows, *shared)
    spec = P(axes or None, tokens_over) if split_tokens else P(axes)
    manual = (*axes, tokens_over) if split_tokens else axes

    def per_device(*args):
        # ``shared`` marked as varying over the split axes here, at the entry: the transpose of that mark (the
        # sum of their gradients over devices) then runs once, here. Left implicit, it lands wherever ``fn``
        # first mixes them with its rows, which may be inside a ``lax.cond`` that devices take differently: a
        # collective only some devices reach hangs them all.
        own, common = args[: len(rows)], args[len(rows):]
        return fn(*own, *(jax.lax.pcast(x, manual, to="varying") for x in common))

    mapped = jax.shard_map(per_device, in_specs=(spec,) * len(rows) + (P(),) * len(shared), out_specs=spec,
                           axis_names=frozenset(manual))
    return mapped(*rows, *shared)
