"""The decoding weight layout (fused q/k/v and gate/up projections, ``prepare_for_decoding``) gives the same
logits and greedy tokens as the HF layout and as transformers ``generate`` (fp32, tiny Qwen3 and Llama with
GQA), and its fused weights are built once, at preparation, never inside a decode call."""

import numpy as np
import pytest

import torch  # the test extra installs it: a broken install fails the run, never skips

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from longrm_jax import load_pretrained  # noqa: E402
from longrm_jax.hf.save import save_pretrained  # noqa: E402
from longrm_jax.evaluation.grm.generation import (  # noqa: E402
    PREFILL_MLP_CHUNK_TOKENS, GreedyGenerator, _decode, prepare_for_decoding)
from longrm_jax.parallel.mesh import make_mesh  # noqa: E402
from helpers.tiny_checkpoint import make_tiny_checkpoint  # noqa: E402

VOCAB = 300
NEW_TOKENS = 10
CASES = {  # GQA everywhere (4 query heads on 2 kv heads); Llama also with projection biases
    "qwen3": dict(family="qwen3"),
    "llama_bias": dict(family="llama", attention_bias=True, mlp_bias=True),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / request.param
    ref = make_tiny_checkpoint(path, head="causal_lm", vocab_size=VOCAB, pad_token_id=0, kv_heads=2,
                               **CASES[request.param])
    if request.param == "llama_bias":  # HF initialises biases to zero: make them matter
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, tensor in ref.named_parameters():
                if name.endswith(".bias"):
                    tensor.copy_(0.1 * torch.randn(tensor.shape, generator=generator))
        ref.save_pretrained(path)
    return path, ref


def _prompts():
    rng = np.random.default_rng(5)
    return [rng.integers(5, VOCAB, n).astype(np.int32) for n in (13, 40, 7, 26)]


@pytest.mark.slow
def test_fused_layout_matches_unfused_and_generate(checkpoint):
    path, ref = checkpoint
    plain = load_pretrained(path, dtype="float32")
    fused = prepare_for_decoding(load_pretrained(path, dtype="float32"))
    assert fused.config.mlp_chunk_tokens == PREFILL_MLP_CHUNK_TOKENS
    # Prefills of more than 8 tokens run the fused MLP in token chunks (as a 128K prompt does at 8,192)
    tiled = prepare_for_decoding(load_pretrained(path, dtype="float32"), mlp_chunk_tokens=8)
    assert not fused.config.unroll_cached_layers  # XLA decode attention on the CPU: the scanned loop
    assert prepare_for_decoding(load_pretrained(path, dtype="float32"),
                                decode_attention="pallas_interpret").config.unroll_cached_layers
    cfg = plain.config
    layers = fused.model.layers
    assert "qkv_proj" in layers.names and "gate_up_proj" in layers.names
    assert not {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"} & set(layers.names)
    g = cfg.num_heads // cfg.num_kv_heads
    assert layers.qkv_proj[...].shape == (cfg.num_layers, cfg.hidden_size, cfg.num_kv_heads, g + 2, cfg.head_dim)
    assert layers.gate_up_proj[...].shape == (cfg.num_layers, cfg.hidden_size, 2, cfg.intermediate_size)
    size = lambda m: sum(x.size for x in jax.tree.leaves(m.model.layers.stacked()))  # noqa: E731
    assert size(fused) == size(plain)  # replaced, not added

    prompts = _prompts()
    ids = jnp.asarray(prompts[1][None])
    np.testing.assert_allclose(np.asarray(fused(ids)), np.asarray(plain(ids)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(tiled(ids)), np.asarray(plain(ids)), rtol=1e-5, atol=1e-5)

    stops = [1]
    expected = []
    for prompt in prompts:
        with torch.no_grad():
            out = ref.generate(torch.tensor(prompt[None].astype(np.int64)), max_new_tokens=NEW_TOKENS,
                               do_sample=False, eos_token_id=None, pad_token_id=0)
        expected.append(out[0, len(prompt):].numpy())
    results = {}
    # The GPU's decode kernel (interpreted): continuous slots refilled over stale columns of earlier prompts.
    kernel = prepare_for_decoding(load_pretrained(path, dtype="float32"), decode_attention="pallas_interpret",
                                  mlp_chunk_tokens=8)
    for name, model in (("plain", plain), ("fused", fused), ("fused_tiled", tiled), ("fused_kernel", kernel)):
        for continuous in (False, True):
            generator = GreedyGenerator(model, pad_id=0, stop_ids=stops, max_new_tokens=NEW_TOKENS,
                                        letter_ids=[37, 38], batch_size=2, continuous=continuous, decode_chunk=4)
            results[name, continuous] = generator.generate(prompts, progress=False)
    for key, outs in results.items():
        for index, (out, theirs) in enumerate(zip(outs, expected)):
            np.testing.assert_array_equal(out.tokens, theirs, err_msg=f"{key}, prompt {index}")
    for continuous in (False, True):
        for name in ("fused", "fused_tiled", "fused_kernel"):
            for ours, theirs in zip(results[name, continuous], results["plain", continuous]):
                np.testing.assert_allclose(ours.letter_logprobs, theirs.letter_logprobs, rtol=1e-5, atol=1e-5)


def _concatenations(jaxpr, found):
    """Output shapes of every concatenate in ``jaxpr`` and its sub-jaxprs (loop bodies, pjit calls)."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "concatenate":
            found.append(tuple(eqn.outvars[0].aval.shape))
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    _concatenations(sub.jaxpr, found)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    _concatenations(sub, found)
    return found


def test_fused_weights_built_once(checkpoint):
    """Preparing is a one-time, idempotent step; the decode program reads the stored fused weights (it
    concatenates no weight), and on a mesh the fused weights are placed by their logical axis names."""
    path, _ = checkpoint
    model = prepare_for_decoding(load_pretrained(path, dtype="float32"))
    layers = model.model.layers
    qkv, gate_up = layers.qkv_proj[...], layers.gate_up_proj[...]
    prepare_for_decoding(model)
    assert layers.qkv_proj[...] is qkv and layers.gate_up_proj[...] is gate_up
    with pytest.raises(KeyError, match="qkv_proj|gate_up_proj"):  # no HF name: a fused model is not exported by mistake
        save_pretrained(model, path.parent / "export", progress=False)

    cache = model.init_cache(2, 24)
    first = jnp.zeros((2,), jnp.int32)
    jaxpr = jax.make_jaxpr(lambda m, c, t: _decode(m, c, t, jnp.zeros((2, 2)), jnp.full((2,), 8), jnp.array([1]),
                                                   jnp.array([37, 38]), max_new=4, pad_id=0))(model, cache, first)
    weight_shapes = {qkv.shape, qkv.shape[1:], gate_up.shape, gate_up.shape[1:]}
    assert not set(_concatenations(jaxpr.jaxpr, [])) & weight_shapes

    mesh = make_mesh(fsdp=4, tensor=2, devices=jax.devices()[:8])
    plain = load_pretrained(path, dtype="float32", mesh=mesh)
    q = np.asarray(plain.model.layers.q_proj[...])
    sharded = prepare_for_decoding(load_pretrained(path, dtype="float32", mesh=mesh)).model.layers
    assert sharded.qkv_proj[...].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None, None)
    assert sharded.gate_up_proj[...].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", None, "tensor")
    np.testing.assert_array_equal(np.asarray(sharded.qkv_proj[...]), np.asarray(qkv))
    np.testing.assert_array_equal(
        np.asarray(qkv)[:, :, :, :-2].reshape(q.shape), q)  # query heads in HF order after the regrouping
