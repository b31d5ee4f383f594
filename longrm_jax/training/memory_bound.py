"""What a train step needs at least, known before compiling it: the plan's early refusal.

``LowerBound`` sums what the gradient program holds whatever XLA does (train state, gradients, batch and, under a
remat policy that keeps its saves on the device, every layer's saved input); ``refuse_early`` stops a run whose
bound alone exceeds the budget before a compile of 20 s or more. ``MemoryPlanError`` is the plan's refusal, here
or after compiling (``training.memory_plan``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import numpy as np

from longrm_jax.cli_support import ExitStatus
from longrm_jax.training.host_memory import format_bytes, format_sizes
from longrm_jax.training.state import on_host

ON_DEVICE_REMAT = ("none", "dots_saveable", "save_attention_out", "full")  # what these save stays on the device


class MemoryPlanError(RuntimeError):
    """The compiled train step needs more device memory than there is. ``tried``: the candidates' one-line
    results; ``last``: (candidate, its programs) of the last one compiled (None: refused before compiling)."""

    exit_code = ExitStatus.DOES_NOT_FIT  # as --compile-only's refusal

    def __init__(self, message: str, tried: list | None = None, last: tuple | None = None):
        super().__init__(message)
        self.tried, self.last = tried or [], last

    def with_line(self, line: str) -> MemoryPlanError:
        """The same refusal with one more line (what the budget was)."""
        return MemoryPlanError(f"{self}\n{line}", self.tried, self.last)


def bytes_per_device(tree, *, memory: str = "device") -> int:
    """Bytes of one device's shards of a tree of arrays / ShapeDtypeStructs with shardings, counting the leaves
    in device memory (``memory="device"``) or in host memory (``"host"``: an offloaded optimizer state)."""
    total = 0
    for x in jax.tree.leaves(tree):
        if on_host(x) != (memory == "host"):
            continue
        shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
        total += int(np.prod(shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize
    return total


@dataclass(frozen=True)
class LowerBound:
    """Device bytes per device that the gradient program needs whatever XLA does, known before compiling it.

    Each term is part of the plan's own peak of that program (``ProgramMemory.peak``), so a bound over the
    budget means the compiled step could not fit either: the train state (``resident``), the batch (``inputs``),
    the gradients it returns (outputs, nothing donated to alias them), and, under a remat policy that keeps its
    saves on the device, the input of every layer that the layer scan stacks for the backward (temporaries; one
    [tokens, hidden] per layer in the compute dtype, ``models.layers.LAYER_INPUT_NAME``) for one micro step. The
    stack's share of the busiest device is at least its size over all devices. The update program's peak (state
    + gradients) is never larger than this.

    Under ``none`` and ``save_attention_out`` with every weight trained (no LoRA), each layer keeps more than its
    input: the attention output (o_proj's operand, saved by both) and, under ``none``, the MLP's hidden
    activation (down_proj's operand; not with a tiled MLP), which their weights' gradients read (x^T dy).
    Counting them refuses the CPU's data.batch_rows=100000 (827 GiB compiled) before a compile of 20 s or more."""

    state: int
    gradients: int
    batch: int
    layer_inputs: int = 0
    layer_inputs_how: str = ""
    layer_saves: str = "layer inputs"  # what layer_inputs counts: "layer inputs", or "activations" beyond them

    @property
    def total(self) -> int:
        return self.state + self.gradients + self.batch + self.layer_inputs

    def describe(self) -> str:
        text = (f"train state {format_bytes(self.state, 1)} + gradients {format_bytes(self.gradients, 1)} + batch "
                f"{format_bytes(self.batch, 1)}")
        if self.layer_inputs:
            text += (f" + {self.layer_saves} kept for the backward {format_bytes(self.layer_inputs, 1)} "
                     f"({self.layer_inputs_how})")
        return text


def lower_bound(state, batch: dict, mcfg, remat: str, grad_accum: int, devices: int,
                state_device: int | None = None, gradients: int | None = None, *,
                all_weights_trained: bool = False) -> LowerBound:
    """``LowerBound`` of a step on ``devices`` devices with abstract ``state`` and ``batch`` (as the plan builds
    them); ``remat``: the configured policy (``auto`` counts no layer inputs: it may offload them);
    ``state_device``: the state's device bytes when not its shardings' (``state_placement``); ``gradients``: the
    gradients' bytes when not laid out as the parameters (``gradient_bytes``); ``all_weights_trained``: no LoRA
    (the layers' weight gradients read their operands, so policies that save them keep them)."""
    resident = bytes_per_device(state) if state_device is None else state_device
    grads = bytes_per_device(state.params) if gradients is None else gradients
    bound = LowerBound(resident, grads, bytes_per_device(batch))
    if remat not in ON_DEVICE_REMAT:
        return bound
    tokens = int(np.prod(batch["input_ids"].shape, dtype=np.int64)) // grad_accum
    itemsize = np.dtype(mcfg.compute_dtype).itemsize
    per_token, width, saves = mcfg.hidden_size, f"{mcfg.hidden_size}", "layer inputs"
    if all_weights_trained and remat in ("none", "save_attention_out"):
        extra = [("attention out", mcfg.num_heads * mcfg.head_dim)]
        # A tiled MLP (mlp_chunk_tokens) recomputes its chunks' hidden activation in the backward instead.
        extra += [("MLP hidden", mcfg.intermediate_size)] if remat == "none" and not mcfg.mlp_chunk_tokens else []
        per_token += sum(n for _, n in extra)
        width = f"({mcfg.hidden_size} input + " + " + ".join(f"{n} {what}" for what, n in extra) + ")"
        saves = "activations"
    stacked = mcfg.num_layers * tokens * per_token * itemsize
    how = (f"{mcfg.num_layers} layers x {tokens:,} tokens x {width} x {itemsize} bytes"
           + (f" over {devices} devices" if devices > 1 else ""))
    return dataclasses.replace(bound, layer_inputs=stacked // devices, layer_inputs_how=how, layer_saves=saves)


def refuse_early(bound: LowerBound, budget: int | None, remat: str, hints: tuple[str, ...]) -> None:
    """Raise ``MemoryPlanError`` when ``bound`` alone exceeds ``budget``: nothing to compile."""
    if budget is None or bound.total <= budget:
        return
    need, available = format_sizes(bound.total, budget)
    raise MemoryPlanError(
        f"the train step does not fit the device: predicted at least {need} per device "
        f"(lower bound: {bound.describe()}), available {available} (model.remat={remat}; before "
        f"compiling)\nreduce it with: " + "; ".join(hints))
