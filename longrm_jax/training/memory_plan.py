"""Compile a run's train step before any weights are loaded, predict its device memory, and choose the remat
policy (``model.remat: auto``).

Why before the first step: loading an 8B checkpoint and compiling take minutes, and an out-of-memory error
at the first step (or, worse, in the optimizer program after the first backward) wastes them. XLA's compiled
programs say how much memory they need (``compiled.memory_analysis()``: per device, for SPMD programs), so the
trainer compiles the two programs of a step (gradients, update; see ``training.steps``) against abstract
inputs, with their real shardings, and compares their peak with what the device has.

A program's peak = its arguments + its outputs not aliased to (donated) arguments + its temporaries. The step
is two programs that run one after the other, so the run needs the larger of the two. Nothing else of size is
live during training: batches are a few MB, the evaluation program runs on the same weights without the
optimizer state.

Offloading remat policies (``offload_layer_inputs*``, models.layers) keep the saved activations in pinned host
memory: XLA places those buffers in the host memory space, and the same analysis reports them as host bytes
(``host_temp_size_in_bytes``). The plan checks them against a host budget too: pinned (page-locked) memory
cannot be swapped, and running the host out of it kills the process or the machine.

Before compiling anything the plan checks a lower bound (``training.memory_bound``: train state, gradients, batch
and, under a remat policy that saves on the device, the layer inputs the layer scan stacks): a request it proves hopeless
(1M-token rows on 4 chips without a ring) is refused in seconds instead of after minutes of compiling. A program
the compiler itself refuses for lack of memory (libtpu checks HBM while compiling) is a "does not fit" too.
The refusal names only the knobs that would change something for this config (``reduce_hints``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections import Counter
from dataclasses import dataclass

import jax
import numpy as np

from longrm_jax import xla_log
from longrm_jax.models.layers import device_twin
from longrm_jax.parallel.target import target_of
from longrm_jax.parallel.topology import GiB
from longrm_jax.training.host_memory import cpu_budget_line, cpu_device_budget, format_bytes, format_sizes
from longrm_jax.training.memory_bound import (  # noqa: F401 - part of this module's API (tests, mesh_plan)
    ON_DEVICE_REMAT, LowerBound, MemoryPlanError, bytes_per_device, lower_bound, refuse_early)
from longrm_jax.training.memory_budget import HOST_RAM_SHARE, device_budget, host_budget
from longrm_jax.training.remat_candidates import AUTO_MLP_CHUNK_TOKENS, AUTO_REMAT_ORDER, RematCandidate
from longrm_jax.training.step_compile import abstract_batch, abstract_step_state, compile_step
from longrm_jax.training.steps import gradient_shardings

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ProgramMemory:
    """One program's device memory while it runs, in bytes per device.

    ``resident``: the train state (parameters, frozen weights, optimizer moments), live during every program;
    ``inputs``: the program's other arguments (the batch; the gradients for the update); ``outputs`` and
    ``aliased`` (outputs written into donated arguments) and ``temp`` from XLA's memory analysis; ``host``: the
    bytes the program keeps in host memory per device (offloaded activations), zero for on-device policies. The state is
    counted separately because a jitted program's own argument size leaves out arguments it does not read (the
    gradient program never reads the optimizer moments), yet they occupy the device all along (Qwen3-8B,
    2 x 32K, BT: 105.0 GiB counted this way for a measured peak of 105.0, 76.8 from the arguments alone;
    docs/perf_training.md, "The product path: the trainer's own step").
    """

    name: str
    resident: int
    inputs: int
    outputs: int
    aliased: int
    temp: int
    host: int = 0
    refused: str = ""  # the XLA compiler's own out-of-memory message when it refused to build the program

    @classmethod
    def refused_by_compiler(cls, name: str, error: Exception, resident: int, inputs: int) -> ProgramMemory:
        """A program the compiler would not build for lack of device memory (libtpu checks a program against the
        chip's HBM while it compiles, e.g. "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory
        required for HLO temporaries (499.35G) exceeds available HBM (95.73G)"): its temporaries are the
        compiler's figure (GiB, as libtpu prints them; 0 where it names none), its outputs unknown (0)."""
        text = str(error).strip().splitlines()[0]
        found = re.search(r"temporaries \(([0-9.]+)G\)", text)
        return cls(name, resident, inputs, 0, 0, int(float(found.group(1)) * GiB) if found else 0, refused=text)

    @classmethod
    def of(cls, name: str, compiled, resident: int, inputs: int) -> ProgramMemory | None:
        ma = compiled.memory_analysis()
        if ma is None:
            return None
        host = sum(int(getattr(ma, f"host_{k}_size_in_bytes", 0) or 0) for k in ("argument", "output", "temp"))
        host -= int(getattr(ma, "host_alias_size_in_bytes", 0) or 0)
        return cls(name, resident, inputs, int(ma.output_size_in_bytes), int(ma.alias_size_in_bytes),
                   int(ma.temp_size_in_bytes), host)

    @property
    def peak(self) -> int:
        return self.resident + self.inputs + self.outputs - self.aliased + self.temp

    def describe(self) -> str:
        host = f"; pinned host {format_bytes(self.host)}" if self.host else ""
        if self.refused:
            return (f"{self.name}: train state {format_bytes(self.resident, 1)} + inputs {format_bytes(self.inputs, 1)}"
                    f" + temporaries {format_bytes(self.temp, 1)} = at least {format_bytes(self.peak)}; the compiler "
                    f"refused it: {self.refused}")
        return (f"{self.name}: train state {format_bytes(self.resident, 1)} + inputs {format_bytes(self.inputs, 1)} + "
                f"outputs {format_bytes(self.outputs - self.aliased, 1)} + temporaries {format_bytes(self.temp, 1)} = "
                f"{format_bytes(self.peak)}{host}")


def state_placement(cfg, state) -> tuple[int, int, int]:
    """(device, host, unplaced): bytes per device of the train state between steps in device memory and in pinned
    host memory, and of those host bytes the ones the devices could not place. ``optim.offload_state`` gives the
    optimizer moments a ``pinned_host`` sharding; devices without a host memory space (JAX's compile-only GPU
    devices) drop that memory kind, so the shardings say "device" and the moments are moved to the host side
    here by their size (``unplaced``): a run on the real devices keeps them there between steps."""
    device, host = bytes_per_device(state), bytes_per_device(state, memory="host")
    unplaced = 0
    if cfg.optim.offload_state and host == 0:
        unplaced = bytes_per_device(state.opt_state)
        device, host = device - unplaced, unplaced
    return device, host, unplaced


def predicted_peak(programs: list[ProgramMemory]) -> int:
    return max((p.peak for p in programs), default=0)


def predicted_host(programs: list[ProgramMemory]) -> int:
    """Pinned host bytes per device the step needs (the largest program's; they run one after the other)."""
    return max((p.host for p in programs), default=0)


# What a refusal suggests, each knob's text written once: ``reduce_hints`` picks those that would change something
# for the config; ``REDUCE_HINTS`` is every knob, for a caller that has not narrowed them.
_HINT = {
    "remat_full": "model.remat=full (or auto: the fastest policy that fits)",
    "remat_offload": "model.remat=offload_layer_inputs (the layers' saved inputs in pinned host memory instead of "
                     "the device's)",
    "remat_offload_less": "model.remat=offload_layer_inputs (attention recomputed: nothing of it saved)",
    "mlp_chunk": f"model.mlp_chunk_tokens={AUTO_MLP_CHUNK_TOKENS} (the sequence-tiled MLP)",
    "seq_len": "a shorter data.seq_len",
    "fewer_rows": ", or fewer data.batch_rows per micro step (grad_accum keeps the step's batch)",
    "more_devices": "more devices (GPUs, or a larger --topology when compiling), then mesh.seq > 1 (sequence "
                    "parallel: ring attention splits the activations over them) or mesh.fsdp > 1 (weights, "
                    "gradients and optimizer state sharded over them)",
    "fsdp": "more devices on mesh.fsdp (weights, gradients and optimizer state are sharded over them)",
    "lora": "lora.rank > 0 (LoRA: no gradients or optimizer state for the base weights)",
    "bf16": "model.param_dtype=bfloat16 (halves weights, gradients and optimizer state; fp32 masters are the "
            "default)",
    "offload_state": "optim.offload_state=true (AdamW moments in pinned host memory between steps)",
}


def _seq_hint(seq: int) -> str:
    return f"mesh.seq > {seq} (sequence parallel: ring attention splits the activations over devices)"


REDUCE_HINTS = (_HINT["remat_full"], _HINT["mlp_chunk"], _HINT["seq_len"] + _HINT["fewer_rows"], _seq_hint(1),
                _HINT["fsdp"], _HINT["lora"], _HINT["bf16"], _HINT["offload_state"])


def reduce_hints(cfg, mesh_shape: dict) -> tuple[str, ...]:
    """The knobs of ``REDUCE_HINTS`` that would change something for ``cfg`` on a mesh of ``mesh_shape``
    (axis -> size): no remat advice where the policy saves nothing more than it must (or ``auto`` already
    tries every policy), no LoRA advice to a LoRA run, and so on."""
    remat, chunk = cfg.model.remat, cfg.model.mlp_chunk_tokens
    hints = []
    if remat in ("none", "dots_saveable", "save_attention_out"):
        hints.append(_HINT["remat_full"])
    if remat in ON_DEVICE_REMAT:
        hints.append(_HINT["remat_offload"])
    elif remat == "offload_layer_inputs_and_attention":
        hints.append(_HINT["remat_offload_less"])
    if chunk > AUTO_MLP_CHUNK_TOKENS or (chunk == 0 and remat != "auto"):
        hints.append(_HINT["mlp_chunk"])
    rows_per_device = cfg.data.batch_rows / (mesh_shape.get("data", 1) * mesh_shape.get("fsdp", 1))
    hints.append(_HINT["seq_len"] + (_HINT["fewer_rows"] if rows_per_device > 1 else ""))
    if int(np.prod(list(mesh_shape.values()))) == 1:  # one device: the mesh knobs need more of them first
        hints.append(_HINT["more_devices"])
    else:
        hints += [_seq_hint(mesh_shape.get("seq", 1)), _HINT["fsdp"]]
    if cfg.lora.rank == 0:
        hints.append(_HINT["lora"])
    if cfg.model.param_dtype == "float32":
        hints.append(_HINT["bf16"])
    if not cfg.optim.offload_state:
        hints.append(_HINT["offload_state"])
    return tuple(hints)


def fits(programs: list[ProgramMemory], budget: int | None, host: int | None) -> bool:
    if any(p.refused for p in programs):
        return False
    return (budget is None or predicted_peak(programs) <= budget) and (host is None or predicted_host(programs) <= host)


def too_big_message(programs: list[ProgramMemory], budget: int | None, remat: str, host: int | None = None,
                    hints: tuple[str, ...] = REDUCE_HINTS) -> str:
    refused = any(p.refused for p in programs)
    if refused or (budget is not None and predicted_peak(programs) > budget):
        at_least = "at least " if refused else ""
        peak, available = format_sizes(predicted_peak(programs), budget if budget is not None else 0)
        available = available if budget is not None else "less (the compiler's figure)"
        what = f"the device: predicted {at_least}{peak} per device, available {available}"
    else:
        pinned, host_budget_text = format_sizes(predicted_host(programs), host)
        what = (f"the host's pinned memory: predicted {pinned} per device of "
                f"offloaded activations, budget {host_budget_text} (host_memory_budget_gib; default "
                f"{HOST_RAM_SHARE:.0%} of RAM over the local devices)")
        # Only an offloading policy uses pinned memory; the host is what is short: keep some layers on the device.
        hints = ("model.offloaded_layers=N below the model's layers (only the first N layers save to the host; "
                 "the rest on the device, where it has room)",) + tuple(hints)
    basis = "the XLA compiler refused the program" if refused else "compiled program analysis"
    lines = [f"the train step does not fit {what} (model.remat={remat}; {basis}):"]
    lines += [f"  {p.describe()}" for p in programs]
    lines.append("reduce it with: " + "; ".join(hints))
    return "\n".join(lines)


def choose(compile_for, candidates, budget: int | None, host: int | None = None,
           hints: tuple[str, ...] = REDUCE_HINTS):
    """``compile_for(remat) -> (compiled, [ProgramMemory])`` for each candidate in order; the first whose device
    peak fits ``budget`` and whose pinned host memory fits ``host`` (None: no check), and that the compiler
    built. Raises ``MemoryPlanError`` naming the last (smallest) one and ``hints`` when none fits."""
    tried = []
    for remat in candidates:
        compiled, programs = compile_for(remat)
        peak, pinned = predicted_peak(programs), predicted_host(programs)
        at_least = ">= " if any(p.refused for p in programs) else ""
        tried.append(f"{remat} {at_least}{peak / GiB:.1f} GiB" + (f" + host {pinned / GiB:.1f} GiB" if pinned else ""))
        if not programs or fits(programs, budget, host):
            return remat, compiled, programs, tried
    label = "auto, tried " + ", ".join(tried) if len(candidates) > 1 else candidates[0]
    raise MemoryPlanError(too_big_message(programs, budget, label, host, hints), tried, (remat, programs))


def gradient_bytes(state, sh) -> int:
    """Bytes per device of the gradients the step passes from its gradient program to its update, laid out as
    the optimizer moments (``training.steps.gradient_shardings``: sharded under ZeRO-1 where the weights are not)."""
    return bytes_per_device(jax.tree.map(lambda p, s: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=s),
                                         state.params, gradient_shardings(sh)))


@dataclass
class StepPlan:
    remat: str
    step: object  # the compiled JittedTrainStep
    programs: list
    tried: list
    mlp_chunk_tokens: int = 0
    device_kind: str = ""  # of the mesh the step was compiled for
    bound: LowerBound | None = None  # what the plan knew before compiling
    offloaded_layers: int | None = None  # model.offloaded_layers of the chosen step (None: every layer)
    mesh_auto: dict | None = None  # mesh: auto's choice and candidates (training.mesh_plan)
    budget: int | None = None  # the device budget the step was planned against (bytes per device)

    def write(self, path: str) -> None:
        """The plan as JSON (``<output_dir>/memory_plan.json``): chosen remat, candidates tried, per program."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"device": self.device_kind or jax.devices()[0].device_kind, "remat": self.remat,
                       "mlp_chunk_tokens": self.mlp_chunk_tokens, "offloaded_layers": self.offloaded_layers,
                       "tried": self.tried, **({"mesh_auto": self.mesh_auto} if self.mesh_auto else {}),
                       "predicted_peak_gib": predicted_peak(self.programs) / GiB,
                       "predicted_host_gib": predicted_host(self.programs) / GiB,
                       "programs": [dict(vars(p), peak=p.peak) for p in self.programs]}, f, indent=1)

    @property
    def offloaded_setting(self) -> str:
        """``", model.offloaded_layers=N"`` where the chosen offloading policy offloads only some layers."""
        partial = self.offloaded_layers is not None and device_twin(self.remat) != self.remat
        return f", model.offloaded_layers={self.offloaded_layers}" if partial else ""

    def summary(self) -> str:
        mem = ", ".join(f"{p.name} {p.peak / GiB:.1f}" for p in self.programs)
        pinned = predicted_host(self.programs)
        host = (f"; pinned host memory {pinned / GiB:.1f} GiB per device (offloaded activations, optimizer state)"
                if pinned else "")
        tiled = f", model.mlp_chunk_tokens={self.mlp_chunk_tokens}" if self.mlp_chunk_tokens else ""
        return f"model.remat={self.remat}{tiled}{self.offloaded_setting}; predicted device memory (GiB): {mem or 'not reported'}{host}"


def plan_train_step(cfg, mcfg, tx, schedule, spec, mesh, key, *, device_bytes: int | None = None) -> StepPlan:
    """Compile the train step for abstract inputs (no weights loaded) and check that it fits the devices;
    with ``model.remat: auto`` try ``AUTO_REMAT_ORDER`` and keep the first that fits.

    ``device_bytes``: the budget of one of the mesh's devices when they cannot say their memory themselves
    (compile-only devices of a topology); the caller has already applied ``memory_budget_gib`` to it
    (``training.compile_only``). The host budget for offloaded activations is then ``host_memory_budget_gib``
    only (the target host's RAM is unknown)."""
    budget, host, budget_line = _budgets(cfg, mesh, device_bytes)
    batch = abstract_batch(cfg, mesh, 1 + spec.num_rejects if spec.slotted else None)
    compile_for = _CandidateStep(cfg, mcfg, tx, schedule, spec, mesh, key, batch)
    candidates = AUTO_REMAT_ORDER if cfg.model.remat == "auto" else (RematCandidate(mcfg.remat),)
    hints = reduce_hints(cfg, {k: int(v) for k, v in mesh.shape.items()})
    state, state_sh = abstract_step_state(cfg, mcfg, tx, mesh, key)
    state_device, state_host, _ = state_placement(cfg, state)
    bound = lower_bound(state, batch, mcfg, cfg.model.remat, cfg.grad_accum, mesh.size, state_device,
                        gradient_bytes(state, state_sh), all_weights_trained=cfg.lora.rank == 0)
    try:
        refuse_early(bound, budget, cfg.model.remat, hints)
        with xla_log.counted(log, compile_for.xla_lines):
            chosen, compiled, programs, tried = choose_with_partial_offload(
                compile_for, candidates, budget, host, hints, auto=cfg.model.remat == "auto",
                num_layers=mcfg.num_layers, state_host=state_host)
    except MemoryPlanError as err:
        if budget_line is None:
            raise
        raise err.with_line(budget_line) from None
    return StepPlan(chosen.policy, compiled, programs, tried, chosen.mlp_chunk_tokens(mcfg.mlp_chunk_tokens),
                    mesh.devices.flat[0].device_kind, bound, compile_for.offloaded_layers(chosen), budget=budget)


def _budgets(cfg, mesh, device_bytes: int | None) -> tuple[int | None, int | None, str | None]:
    """(device budget, host budget, the line a refusal adds about a CPU's budget) in bytes per device."""
    if device_bytes is not None:
        host = int(cfg.host_memory_budget_gib * GiB) if cfg.host_memory_budget_gib is not None else None
        return device_bytes, host, None
    if not cfg.memory_check:
        return None, None, None
    budget = device_budget(mesh.local_devices, cfg.memory_budget_gib)
    host = host_budget(len(mesh.local_devices), cfg.host_memory_budget_gib)
    if budget is None and target_of(mesh).platform == "cpu":  # CPU devices' arrays are in the host's RAM
        budget = cpu_device_budget(cfg, len(mesh.local_devices))
        return budget, host, cpu_budget_line(len(mesh.local_devices)) if budget is not None else None
    return budget, host, None


@dataclass
class _CandidateStep:
    """Called with an auto candidate (``training.remat_candidates``): its compiled step and what each of the
    step's programs needs (``ProgramMemory``), or (None, the refused program) where the compiler ran out of
    memory."""
    cfg: object
    mcfg: object
    tx: object
    schedule: object
    spec: object
    mesh: object
    key: object
    batch: dict
    xla_lines: Counter = dataclasses.field(default_factory=Counter)  # XLA's memory lines hidden while compiling

    def offloaded_layers(self, candidate: RematCandidate) -> int | None:
        """The candidate's offloaded layers, else the configured ``model.offloaded_layers``."""
        return self.mcfg.offloaded_layers if candidate.offloaded_layers is None else candidate.offloaded_layers

    def __call__(self, candidate: RematCandidate):
        mcfg = self.mcfg.replace(remat=candidate.policy, mlp_chunk_tokens=candidate.mlp_chunk_tokens(
            self.mcfg.mlp_chunk_tokens), offloaded_layers=self.offloaded_layers(candidate))
        state, sh = abstract_step_state(self.cfg, mcfg, self.tx, self.mesh, self.key)
        # The device-resident state (optim.offload_state: without the moments). Moments the devices could not
        # place in host memory were compiled as device arguments: the update holds them on the device as a run's
        # update does (there, copies brought in from the host), so its figure keeps them; the gradient program
        # never reads them.
        resident, state_host, unplaced = state_placement(self.cfg, state)
        resident = {"gradients": resident, "update": resident + unplaced}
        inputs = {"gradients": bytes_per_device(self.batch), "update": gradient_bytes(state, sh)}
        try:
            compiled = compile_step(self.cfg, mcfg, self.tx, self.schedule, self.spec, self.mesh, state, sh,
                                    self.batch, self.xla_lines)
        except Exception as e:  # noqa: BLE001 - the compiler's out-of-memory refusal is a plan outcome, not a crash
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            name = "update" if "jit_update" in str(e) else "gradients"
            return None, [ProgramMemory.refused_by_compiler(name, e, resident[name], inputs[name])]
        programs = [ProgramMemory.of(n, c, resident[n], inputs[n]) for n, c in compiled.programs]
        # The offloaded moments occupy pinned host memory during both programs: the update reads (and aliases)
        # them, so its analysis counts them; the gradient program never reads them and its analysis leaves them
        # out, so they add to its offloaded activations.
        programs = [dataclasses.replace(p, host=p.host + state_host if p.name == "gradients"
                                        else max(p.host, state_host)) for p in programs if p is not None]
        return compiled, programs


def choose_with_partial_offload(compile_for, candidates, budget: int | None, host: int | None, hints, *,
                                auto: bool, num_layers: int, state_host: int):
    """:func:`choose`, and under ``auto``, when every candidate fit the device but not the host, the last one
    again with as many layers offloaded as the host takes (:func:`partial_offload_candidate`)."""
    try:
        return choose(compile_for, candidates, budget, host, hints)
    except MemoryPlanError as err:
        retry = None
        if auto and err.last is not None:
            retry = partial_offload_candidate(*err.last, num_layers, budget, host, state_host)
        if retry is None:
            raise
        log.info("auto: every policy fits the device but not the host budget; trying %s", retry)
        try:
            chosen, compiled, programs, more = choose(compile_for, (retry,), budget, host, hints)
        except MemoryPlanError as again:
            raise MemoryPlanError(f"{err}\nauto then tried {retry}: {again}", err.tried + again.tried) from None
        return chosen, compiled, programs, err.tried + more


def partial_offload_candidate(candidate: RematCandidate, programs: list, num_layers: int, budget: int | None,
                              host: int | None, state_host: int) -> RematCandidate | None:
    """``candidate`` with the most offloaded layers N whose pinned activations fit ``host``, when
    ``candidate`` (an offloading policy, every layer offloaded) fit the device but not the host and the
    device has room for the other layers' share; None otherwise. The offloaded activations are taken as equal
    per layer (one saved input per layer, and attention outputs under ``..._and_attention``);
    ``state_host``: the optimizer moments kept on the host (optim.offload_state), which do not move."""
    policy = candidate.policy
    if (host is None or not programs or any(p.refused for p in programs) or device_twin(policy) == policy
            or candidate.offloaded_layers is not None):
        return None
    peak, pinned = predicted_peak(programs), predicted_host(programs)
    activations = pinned - state_host
    if (budget is not None and peak > budget) or pinned <= host or activations <= 0:
        return None
    per_layer = activations / num_layers
    layers = int((host - state_host) // per_layer)
    if layers <= 0 or (budget is not None and peak + (num_layers - layers) * per_layer > budget):
        return None
    return dataclasses.replace(candidate, offloaded_layers=layers)
