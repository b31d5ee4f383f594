"""Parameters as a flat ``{"path/to/param": array}`` dict, and the way back to an NNX model.

Training keeps parameters, LoRA adapters and optimizer state as plain pytrees of flat string-keyed dicts:
they jit, shard, donate and checkpoint (orbax) without NNX objects in the way. ``ParamCodec`` remembers
the model's graph and variable metadata so that ``codec.model(values)`` rebuilds the module inside a jitted
function, and ``codec.specs(mesh)`` turns each parameter's logical axis names (NNX ``out_sharding``
metadata) into a ``PartitionSpec`` through ``parallel.logical_to_spec`` (fsdp-style: ``embed`` -> ``fsdp``).
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from longrm_jax.parallel.mesh import logical_to_spec
from longrm_jax.parallel.placement import fit_spec


def path_key(path: tuple) -> str:
    return "/".join(str(p) for p in path)


class ParamCodec:
    """Converts between an NNX module and a flat dict of its ``nnx.Param`` values."""

    def __init__(self, model: nnx.Module):
        self.graphdef, params, self.rest = nnx.split(model, nnx.Param, ...)
        self.variables = {path_key(path): var for path, var in nnx.to_flat_state(params)}
        self.paths = {path_key(path): path for path, _ in nnx.to_flat_state(params)}

    def values(self, model: nnx.Module) -> dict[str, jax.Array]:
        """Flat parameter values of ``model`` (same graph as the codec's)."""
        params = nnx.state(model, nnx.Param)
        return {path_key(path): var.get_value() for path, var in nnx.to_flat_state(params)}

    def model(self, values: Mapping[str, jax.Array]) -> nnx.Module:
        """A module with these parameter values (usable inside ``jax.jit``)."""
        missing = set(self.variables) - set(values)
        if missing:
            raise KeyError(f"parameters missing: {sorted(missing)[:5]}")
        state = nnx.from_flat_state({self.paths[k]: var.replace(values[k]) for k, var in self.variables.items()})
        return nnx.merge(self.graphdef, state, self.rest)

    def logical_names(self, key: str) -> tuple | None:
        names = self.variables[key].get_metadata().get("out_sharding")
        return tuple(names) if names else None

    def shapes(self) -> dict[str, jax.ShapeDtypeStruct]:
        return {k: jax.ShapeDtypeStruct(v.get_value().shape, v.get_value().dtype) for k, v in self.variables.items()}

    def specs(self, mesh=None, rules=None) -> dict[str, P]:
        """PartitionSpec per parameter from its logical names (replicated when it has none)."""
        out = {}
        for key, var in self.variables.items():
            names = self.logical_names(key)
            shape = var.get_value().shape
            spec = logical_to_spec(names, rules, mesh) if names and len(names) == len(shape) else P()
            out[key] = fit_spec(spec, shape, mesh)  # tiny test models: replicate what does not divide
        return out


def shardings(specs, mesh):
    """NamedSharding tree for a tree of PartitionSpecs."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def cast(tree, dtype):
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)
