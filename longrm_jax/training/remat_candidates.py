"""``model.remat: auto``'s candidates: the remat policies it tries, fastest first, and the two suffixes of a
candidate's name (``+tiled_mlp``: with the sequence-tiled MLP; ``@N``: only the first N layers offloaded).
``training.memory_plan`` compiles them in this order and takes the first that fits."""

from __future__ import annotations

# model.remat: auto tries these, fastest first, and takes the first that fits. The offloading policies come
# last: they move saved activations over PCIe every step, so they are taken only when nothing on the device fits.
# "<policy>+tiled_mlp": the policy with the sequence-tiled MLP (model.mlp_chunk_tokens = AUTO_MLP_CHUNK_TOKENS):
# a layer's [tokens, intermediate] buffers shrink to [chunk, intermediate] for a little re-laying-out of the
# layer's MLP input and output, cheaper than moving activations over PCIe, so ``full`` tiled comes before the
# offloading policies and the tiled offloading policy last.
TILED_MLP = "+tiled_mlp"
AUTO_REMAT_ORDER = ("none", "save_attention_out", "save_attention_out" + TILED_MLP, "full", "full" + TILED_MLP,
                    "offload_layer_inputs_and_attention", "offload_layer_inputs", "offload_layer_inputs" + TILED_MLP)
# Tokens per MLP chunk that auto uses: the chunk's matmuls ([8192, D] x [D, F]) still fill a Hopper GPU, and its
# intermediates are 0.2 GiB each at F = 14336 in bf16.
AUTO_MLP_CHUNK_TOKENS = 8192


# "<candidate>@N": the candidate with model.offloaded_layers = N (only the first N layers offload). auto adds one
# when every candidate it tried fits the device but not the host budget (:func:`partial_offload_candidate`).
OFFLOADED_AT = "@"


def split_offloaded(candidate: str) -> tuple[str, int | None]:
    """(candidate without ``@N``, N or None)."""
    name, at, layers = candidate.partition(OFFLOADED_AT)
    return name, int(layers) if at else None


def parse_candidate(candidate: str, mlp_chunk_tokens: int) -> tuple[str, int]:
    """(remat policy, mlp_chunk_tokens) of an auto candidate; ``mlp_chunk_tokens``: the configured value (a
    configured tiling applies to every candidate)."""
    candidate = split_offloaded(candidate)[0]
    if candidate.endswith(TILED_MLP):
        return candidate[: -len(TILED_MLP)], mlp_chunk_tokens or AUTO_MLP_CHUNK_TOKENS
    return candidate, mlp_chunk_tokens
