"""``python -m longrm_jax.evaluate --compile-only --topology NAME``: the evaluator's own programs compiled for a
TPU slice or GPU cluster this host does not have (``parallel.topology``), with no weights and no data.

Programs, the jitted functions the evaluator runs (same modules, same shardings):
- DisRM: the scoring forward (``evaluation.scoring``: the classifier pooling itself, or the per-token head
  gathered at the pooled index when tokens are split over ``seq``);
- GRM: the prefill that fills the KV cache and the greedy decode loop (``evaluation.generation``), on the
  decoding weight layout (``prepare_for_decoding``: fused projections, the decode attention ``auto`` picks for
  the target devices).
The model is abstract: its parameters are ``ShapeDtypeStruct``s placed by their logical names on the mesh, as
``load_pretrained`` would place the weights. Each program is reported per chip: arguments (weights, cache),
temporaries and peak against the chip's HBM, FLOPs from XLA's cost analysis, kernels and collectives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding

from longrm_jax.evaluation.generation import _jitted_decode, _jitted_prefill, prepare_for_decoding
from longrm_jax.evaluation.scoring import _JITTED_CLASSIFIER, _JITTED_GATHERED
from longrm_jax.models.decoder import build_model
from longrm_jax.ops.flash import compiling_for
from longrm_jax.parallel.compiled import cost_flops, describe_counts, flop_text, hlo_op_counts
from longrm_jax.parallel.mesh import logical_to_spec
from longrm_jax.parallel.placement import fit_spec
from longrm_jax.parallel.topology import GiB, Topology

@dataclass
class ProgramReport:
    name: str
    arguments: int
    outputs: int
    temp: int
    peak: int
    flops: float | None
    counts: dict = field(default_factory=dict)

    def describe(self, hbm: int) -> str:
        flops = "n/a" if self.flops is None else flop_text(self.flops)
        return (f"{self.name}: arguments {self.arguments / GiB:.2f} + outputs {self.outputs / GiB:.2f} + "
                f"temporaries {self.temp / GiB:.2f} = peak {self.peak / GiB:.2f} GiB of {hbm / GiB:.1f} "
                f"({'fits' if self.peak <= hbm else 'DOES NOT FIT'}); {flops} per chip; "
                f"{describe_counts(self.counts)}")


def _program(name: str, compiled) -> ProgramReport:
    ma = compiled.memory_analysis()
    args, outs, alias, temp = (int(getattr(ma, f"{k}_size_in_bytes", 0) or 0)
                               for k in ("argument", "output", "alias", "temp"))
    return ProgramReport(name, args, outs, temp, args + outs - alias + temp, cost_flops(compiled),
                         hlo_op_counts(compiled.as_text()))


def abstract_model(mcfg, mesh, *, decoding: bool, decode_attention: str = "auto"):
    """The model of ``mcfg`` with ``ShapeDtypeStruct`` parameters placed on ``mesh`` by their logical names
    (what ``load_pretrained(..., mesh=mesh)`` places); ``decoding``: in the decoding layout."""
    def build():
        model = build_model(mcfg)
        return prepare_for_decoding(model, mesh, decode_attention) if decoding else model

    abstract = nnx.eval_shape(build)  # outside the mesh context: logical names are not mesh axes
    graphdef, state = nnx.split(abstract)
    for _, var in nnx.to_flat_state(state):
        value = var.get_value()
        names = var.get_metadata().get("out_sharding")
        spec = fit_spec(logical_to_spec(names, None, mesh), value.shape, mesh)
        var.set_value(jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=NamedSharding(mesh, spec)))
    return nnx.merge(graphdef, state)


def _tokens(mesh, rows: int, length: int, names=("batch", "seq"), dtype=jnp.int32):
    shape = (rows, length)[: len(names)]
    spec = fit_spec(logical_to_spec(names, None, mesh), shape, mesh)
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))


def compile_programs(mcfg, topology: Topology, mesh, *, is_disrm: bool, rows: int, length: int,
                     max_new_tokens: int, decode_attention: str = "auto") -> list[ProgramReport]:
    """Compile the evaluator's programs for ``rows`` x ``length``-token prompts on ``mesh`` (see the module
    docstring); the GRM cache holds ``length + max_new_tokens`` slots."""
    seq = int(dict(mesh.shape).get("seq", 1))
    ids, positions = _tokens(mesh, rows, length), _tokens(mesh, rows, length)
    rows_only = _tokens(mesh, rows, length, names=("batch",))
    reports = []
    model = abstract_model(mcfg, mesh, decoding=not is_disrm, decode_attention=decode_attention)
    with compiling_for(list(mesh.devices.flat)), jax.set_mesh(mesh):
        if is_disrm:
            if seq == 1 and mcfg.pad_token_id is not None:
                compiled = _JITTED_CLASSIFIER.lower(model, ids).compile()
            else:
                compiled = _JITTED_GATHERED.lower(model, ids, positions, rows_only).compile()
            return [_program(f"scoring [{rows} x {length}]", compiled)]
        letters = jax.ShapeDtypeStruct((4,), jnp.int32, sharding=NamedSharding(mesh, logical_to_spec(None)))
        prefill = _jitted_prefill(length + max_new_tokens).lower(model, ids, positions, rows_only, letters)
        compiled = prefill.compile()
        reports.append(_program(f"prefill [{rows} x {length}]", compiled))
        cache, first, first_letters = _with_shardings(prefill.out_info, compiled.output_shardings)
        stops = jax.ShapeDtypeStruct((2,), jnp.int32, sharding=NamedSharding(mesh, logical_to_spec(None)))
        decode = _jitted_decode(max_new_tokens, int(mcfg.pad_token_id or 0), topology.platform != "cpu")
        compiled = decode.lower(model, cache, first, first_letters, rows_only, stops, letters).compile()
        reports.append(_program(f"decode [{rows} rows, cache {length + max_new_tokens}, {max_new_tokens} steps]",
                                compiled))
    return reports


def _with_shardings(out_info, shardings):
    return jax.tree.map(lambda info, sh: jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=sh), out_info,
                        shardings)
