"""``python -m longrm_jax.evaluate --compile-only --topology NAME``: the evaluator's own programs compiled for a
TPU slice or GPU cluster this host does not have (``parallel.topology``), with no weights and no data.

Programs, the jitted functions the evaluator runs (same modules, same shardings):
- DisRM: the scoring forward (``evaluation.scoring``: the classifier pooling itself, or the per-token head
  gathered at the pooled index when tokens are split over ``seq``);
- GRM: the prefill that fills the KV cache and the greedy decode loop (``evaluation.grm.generation``), on the
  decoding weight layout (``prepare_for_decoding``: fused projections, the decode attention ``auto`` picks for
  the target devices).
The model is abstract: its parameters are ``ShapeDtypeStruct``s placed by their logical names on the mesh, as
``load_pretrained`` would place the weights. Each program is reported per chip: arguments (weights, cache),
temporaries and peak against the chip's HBM, FLOPs, kernels and collectives. FLOPs are counted as
docs/flops.md counts them (:func:`counted_flops`), beside XLA's cost analysis, which counts the body of a loop
(the scanned layers, the tiled prefill MLP's chunks, the decode steps) once.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding

from longrm_jax import xla_log
from longrm_jax.evaluation.grm.estimate import prefill_flops
from longrm_jax.evaluation.grm.generation import _jitted_decode, _jitted_prefill, prepare_for_decoding
from longrm_jax.evaluation.scoring import _JITTED_CLASSIFIER, _JITTED_GATHERED
from longrm_jax.models.flop_counts import attended_columns, decoder_matmul_params, output_head_params
from longrm_jax.models.heads import build_model
from longrm_jax.ops.flash import compiling_for
from longrm_jax.parallel.compiled import cost_flops, describe_counts, flop_text, hlo_op_counts
from longrm_jax.parallel.mesh import logical_to_spec
from longrm_jax.parallel.placement import fit_spec
from longrm_jax.parallel.topology import GiB, Topology

log = logging.getLogger(__name__)

@dataclass
class ProgramReport:
    name: str
    arguments: int
    outputs: int  # not aliased to a donated argument
    temp: int
    peak: int
    flops: float | None  # XLA's cost analysis, per chip (loop bodies once)
    counts: dict = field(default_factory=dict)
    counted: float = 0.0  # docs/flops.md count, per chip
    cache: str = ""  # the GRM decode's KV cache, per chip (cache_text)

    def describe(self, budget: int) -> str:
        xla = "n/a" if self.flops is None else flop_text(self.flops)
        return (f"{self.name}: {self.cache}arguments {self.arguments / GiB:.2f} + outputs not in donated arguments "
                f"{self.outputs / GiB:.2f} + "
                f"temporaries {self.temp / GiB:.2f} = peak {self.peak / GiB:.2f} GiB of the {budget / GiB:.1f} GiB "
                f"budget ({'fits' if self.peak <= budget else 'DOES NOT FIT'}); {flop_text(self.counted)} per chip "
                f"(XLA's cost analysis, loop bodies once: {xla}); {describe_counts(self.counts)}")


def counted_flops(mcfg, program: str, rows: int, length: int, steps: int = 0) -> float:
    """FLOPs of one run of an evaluator program over all chips, as docs/flops.md counts a forward: prompt
    forwards (``2 N S + 2 L H d S^2`` per row, plus the head at the pooled or last token), or ``steps`` decode
    steps per row, each ``2 N`` plus the head plus attention over the cached columns (``4 L H d`` per column,
    ``length + step`` of them)."""
    head = 2 * output_head_params(mcfg, "classifier" if program == "scoring" else "causal_lm")
    if program in ("prefill", "scoring"):
        return rows * (prefill_flops(mcfg, length) + head)
    per_column = 4 * mcfg.num_heads * mcfg.head_dim
    # sum over steps and layers of the columns attended (a sliding-window layer: at most its window)
    columns = sum(attended_columns(mcfg, length + step) for step in range(1, steps + 1))
    return rows * (steps * (2 * decoder_matmul_params(mcfg) + head) + per_column * columns)


def _program(name: str, compiled, counted: float) -> ProgramReport:
    ma = compiled.memory_analysis()
    args, outs, alias, temp = (int(getattr(ma, f"{k}_size_in_bytes", 0) or 0)
                               for k in ("argument", "output", "alias", "temp"))
    # outputs written into donated arguments (the decode's KV cache) take no memory of their own
    return ProgramReport(name, args, outs - alias, temp, args + outs - alias + temp, cost_flops(compiled),
                         hlo_op_counts(compiled.as_text()), counted)


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
    chips = mesh.devices.size
    model = abstract_model(mcfg, mesh, decoding=not is_disrm, decode_attention=decode_attention)
    # XLA's memory lines, when a program does not fit, are counted, not printed (longrm_jax.xla_log)
    with (compiling_for(list(mesh.devices.flat)), jax.set_mesh(mesh), xla_log.counted(log) as hidden,
          xla_log.quiet_xla_memory_lines(hidden)):
        if is_disrm:
            if seq == 1 and mcfg.pad_token_id is not None:
                compiled = _JITTED_CLASSIFIER.lower(model, ids).compile()
            else:
                compiled = _JITTED_GATHERED.lower(model, ids, positions, rows_only).compile()
            return [_program(f"scoring [{rows} x {length}]", compiled,
                             counted_flops(mcfg, "scoring", rows, length) / chips)]
        letters = jax.ShapeDtypeStruct((4,), jnp.int32, sharding=NamedSharding(mesh, logical_to_spec(None)))
        prefill = _jitted_prefill(length + max_new_tokens).lower(model, ids, positions, rows_only, letters)
        compiled = prefill.compile()
        reports.append(_program(f"prefill [{rows} x {length}]", compiled,
                                counted_flops(mcfg, "prefill", rows, length) / chips))
        cache, first, first_letters = _with_shardings(prefill.out_info, compiled.output_shardings)
        stops = jax.ShapeDtypeStruct((2,), jnp.int32, sharding=NamedSharding(mesh, logical_to_spec(None)))
        decode = _jitted_decode(max_new_tokens, int(mcfg.pad_token_id or 0), topology.platform != "cpu")
        compiled = decode.lower(model, cache, first, first_letters, rows_only, stops, letters).compile()
        reports.append(_program(f"decode [{rows} rows, cache {length + max_new_tokens}, {max_new_tokens} steps]",
                                compiled, counted_flops(mcfg, "decode", rows, length, max_new_tokens) / chips))
        reports[-1].cache = cache_text(mcfg, cache)
    return reports


def cache_text(mcfg, cache) -> str:
    """The KV cache's bytes per chip (abstract arrays with their shardings), and which layers keep a ring of
    their window (``models.window_cache``), e.g. "KV cache 8.44 GiB per chip (8 of 48 layers at 133120 slots,
    40 in rings of 1024); " (Gemma 3 12B in bf16, one chip)."""
    per_chip = sum(math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
                   for leaf in jax.tree.leaves(cache) if leaf.ndim)
    layout = (f"{mcfg.num_layers} layers at {cache.max_len} slots" if cache.ring is None else
              f"{cache.k.shape[0]} of {mcfg.num_layers} layers at {cache.max_len} slots, "
              f"{cache.local_k.shape[0]} in rings of {cache.ring}")
    return f"KV cache {per_chip / GiB:.2f} GiB per chip ({layout}); "


def _with_shardings(out_info, shardings):
    return jax.tree.map(lambda info, sh: jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=sh), out_info,
                        shardings)
