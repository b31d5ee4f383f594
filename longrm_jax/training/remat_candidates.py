"""``model.remat: auto``'s candidates: the remat policies it tries, fastest first, each a :class:`RematCandidate`
(a policy, with or without the sequence-tiled MLP, with every layer or only the first N offloaded).
``training.memory_plan`` compiles them in this order and takes the first that fits."""

from __future__ import annotations

import dataclasses

# Tokens per MLP chunk that auto uses: the chunk's matmuls ([8192, D] x [D, F]) still fill a Hopper GPU, and its
# intermediates are 0.2 GiB each at F = 14336 in bf16.
AUTO_MLP_CHUNK_TOKENS = 8192
# How a candidate's name writes its two options, in logs, memory_plan.json and errors:
# "full+tiled_mlp@24" is `full` with the tiled MLP and only the first 24 layers offloaded.
TILED_MLP = "+tiled_mlp"
OFFLOADED_AT = "@"


@dataclasses.dataclass(frozen=True)
class RematCandidate:
    """One step setting that ``auto`` compiles: ``policy`` (a ``model.remat`` policy), ``tiled_mlp`` (the
    sequence-tiled MLP at ``AUTO_MLP_CHUNK_TOKENS``, unless the config sets its own chunk) and
    ``offloaded_layers`` (an offloading policy's first N layers only; None: the configured value)."""

    policy: str
    tiled_mlp: bool = False
    offloaded_layers: int | None = None

    @property
    def name(self) -> str:
        tiled = TILED_MLP if self.tiled_mlp else ""
        at = f"{OFFLOADED_AT}{self.offloaded_layers}" if self.offloaded_layers is not None else ""
        return f"{self.policy}{tiled}{at}"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, name: str) -> RematCandidate:
        """The candidate a name stands for: ``"full+tiled_mlp@24"`` -> RematCandidate("full", True, 24)."""
        base, at, layers = name.partition(OFFLOADED_AT)
        tiled = base.endswith(TILED_MLP)
        return cls(base[: -len(TILED_MLP)] if tiled else base, tiled, int(layers) if at else None)

    def mlp_chunk_tokens(self, configured: int) -> int:
        """The step's ``model.mlp_chunk_tokens``: a configured tiling applies to every candidate."""
        return (configured or AUTO_MLP_CHUNK_TOKENS) if self.tiled_mlp else configured


# model.remat: auto tries these, fastest first, and takes the first that fits. The offloading policies come
# last: they move saved activations over PCIe every step, so they are taken only when nothing on the device fits.
# The tiled MLP shrinks a layer's [tokens, intermediate] buffers to [chunk, intermediate] for a little
# re-laying-out of the layer's MLP input and output, cheaper than moving activations over PCIe, so ``full`` tiled
# comes before the offloading policies and the tiled offloading policy last. auto adds an offloaded-layers
# candidate when every one it tried fits the device but not the host budget (memory_plan.partial_offload_candidate).
AUTO_REMAT_ORDER = tuple(RematCandidate(policy, tiled) for policy, tiled in (
    ("none", False), ("save_attention_out", False), ("save_attention_out", True), ("full", False), ("full", True),
    ("offload_layer_inputs_and_attention", False), ("offload_layer_inputs", False), ("offload_layer_inputs", True)))
