"""Gemma 3's local layers keep only a ring of their window in the KV cache (issue 43, models.window_cache): fp32,
a tiny random 7-layer checkpoint (local layers and a global one) with a window of 16, prompts longer than the
window, generations past it. The ring cache's greedy tokens and logits equal the full cache's and transformers'
``generate`` (scanned layers, where a layer's kind is traced, and unrolled ones; static batches and continuous
batching); the local layers' cache arrays have the window's length; the slot plan counts the smaller cache."""

import functools

import numpy as np
import pytest

import torch
import transformers

import jax
import jax.numpy as jnp

from longrm_jax import load_pretrained
from longrm_jax.evaluation.grm.generation import GreedyGenerator
from longrm_jax.evaluation.grm.slot_plan import kv_cache_bytes, plan_slots
from longrm_jax.models.heads import CausalLM
from longrm_jax.ops.contract import PAD_POSITION
from helpers.family_parity import make_model, rel_err

VOCAB = 256
WINDOW = 16
STEPS = 28
STOP = 3


def _config():
    rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    return transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=7, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=WINDOW, rope_parameters=rope,
        max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3_ring")
    ref = make_model("Gemma3ForCausalLM", _config(), path)
    return ref, path


def _prompts():
    rng = np.random.default_rng(11)
    return [rng.integers(5, VOCAB, n).astype(np.int32) for n in (37, 21, 9)]


def _greedy(model, prompts, steps, rings: bool):
    """Prefill (right-padded, pads at PAD_POSITION as the evaluator writes them), then ``steps`` greedy decode
    steps: (tokens [B, steps + 1], logits [B, steps + 1, V], final cache)."""
    width = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), width), np.int32)
    for row, p in enumerate(prompts):
        ids[row, :len(p)] = p
    lengths = np.array([len(p) for p in prompts], np.int32)
    pos = np.where(np.arange(width)[None] < lengths[:, None], np.arange(width)[None], PAD_POSITION).astype(np.int32)

    @jax.jit
    def run(model, ids, pos, lengths):
        cache = model.init_cache(ids.shape[0], ids.shape[1] + steps, window_rings=rings)
        logits, cache = model(ids, positions=pos, cache=cache, prefill=True, logits_at=lengths - 1)
        token = jnp.argmax(logits[:, 0], -1).astype(jnp.int32)

        def step(carry, t):
            token, cache = carry
            p = (lengths + t)[:, None]
            out, cache = model(token[:, None], positions=p, segment_ids=jnp.ones_like(p), cache=cache)
            nxt = jnp.argmax(out[:, 0], -1).astype(jnp.int32)
            return (nxt, cache), (nxt, out[:, 0])

        (_, cache), (tokens, outs) = jax.lax.scan(step, (token, cache), jnp.arange(steps, dtype=jnp.int32))
        return (jnp.concatenate([token[:, None], tokens.T], 1), jnp.concatenate([logits, outs.swapaxes(0, 1)], 1),
                cache)

    return run(model, jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(lengths))


def _hf_generate(ref, prompt, steps):
    with torch.no_grad():
        out = ref.generate(torch.tensor(prompt[None].astype(np.int64)), max_new_tokens=steps, do_sample=False,
                           pad_token_id=0, eos_token_id=None, output_logits=True, return_dict_in_generate=True)
    return out.sequences[0, len(prompt):].numpy(), torch.stack(out.logits, 1)[0].float().numpy()


def test_local_layers_cache_only_their_window(checkpoint):
    _, path = checkpoint
    model = load_pretrained(path, dtype="float32")
    assert model.config.local_layers == (True,) * 5 + (False, True)
    cache = model.init_cache(3, 100)
    assert cache.k.shape == (1, 3, 100, 2, 16) and cache.positions.shape == (3, 100)  # the global layer
    assert cache.local_k.shape == cache.local_v.shape == (6, 3, WINDOW, 2, 16)
    assert cache.local_positions.shape == cache.local_segment_ids.shape == (3, WINDOW)
    full = model.init_cache(3, 100, window_rings=False)
    assert full.k.shape == (7, 3, 100, 2, 16) and full.local_k is None
    assert model.init_cache(3, WINDOW).local_k is None  # a cache no longer than the window: nothing to save
    ring_bytes = sum(a.nbytes for a in jax.tree.leaves(cache) if a.ndim)
    assert ring_bytes == kv_cache_bytes(model.config, 100) * 3
    assert sum(a.nbytes for a in jax.tree.leaves(full) if a.ndim) == kv_cache_bytes(model.config, 100,
                                                                                   window_rings=False) * 3


@pytest.mark.parametrize("unroll", [False, True])
def test_ring_cache_equals_full_cache_and_generate(checkpoint, unroll):
    """Greedy tokens and every step's logits: ring cache == full cache == transformers' generate, prompts of
    37 and 21 tokens (longer than the window) and 9, 28 steps past them."""
    ref, path = checkpoint
    model = load_pretrained(path, dtype="float32")
    model.replace_config(unroll_cached_layers=unroll)
    prompts = _prompts()
    tokens, logits, cache = _greedy(model, prompts, STEPS, rings=True)
    full_tokens, full_logits, full_cache = _greedy(model, prompts, STEPS, rings=False)
    assert cache.local_k.shape[2] == WINDOW and full_cache.local_k is None
    np.testing.assert_array_equal(tokens, full_tokens)
    # Equal up to fp32 summation order (the decode attention sums 16 ring slots, or 65 masked columns)
    np.testing.assert_allclose(logits, full_logits, rtol=1e-4, atol=1e-4)
    assert rel_err(logits, full_logits) <= 1e-5
    for row, prompt in enumerate(prompts):
        hf_tokens, hf_logits = _hf_generate(ref, prompt, STEPS + 1)
        np.testing.assert_array_equal(np.asarray(tokens[row]), hf_tokens)
        assert rel_err(logits[row], hf_logits) <= 1e-4


def _full_cache_generator(monkeypatch):
    monkeypatch.setattr(CausalLM, "init_cache", functools.partialmethod(CausalLM.init_cache, window_rings=False))


@pytest.mark.parametrize("continuous", [False, True])
def test_generator_with_rings_equals_full_cache_and_generate(checkpoint, monkeypatch, continuous):
    """The evaluator's GreedyGenerator (static batches; continuous batching, whose admission scatters a prompt
    into a pool row's ring): tokens equal transformers' and the full cache's, verdict-letter log-probs the
    full cache's."""
    ref, path = checkpoint
    model = load_pretrained(path, dtype="float32")
    prompts = _prompts() + [np.random.default_rng(12).integers(5, VOCAB, 30).astype(np.int32)]
    pools = []
    real_init = CausalLM.init_cache

    def spy(self, *args, **kwargs):
        pools.append(real_init(self, *args, **kwargs))
        return pools[-1]

    def run():
        generator = GreedyGenerator(model, pad_id=0, stop_ids=[STOP], max_new_tokens=STEPS, letter_ids=[5, 6],
                                    batch_size=2, continuous=continuous, decode_chunk=4)
        return generator.generate(prompts, progress=False)

    with monkeypatch.context() as patch:
        patch.setattr(CausalLM, "init_cache", spy)
        ours = run()
    assert pools and all(c.local_k is not None and c.local_k.shape[2] == WINDOW for c in pools)
    _full_cache_generator(monkeypatch)
    full = run()
    for prompt, mine, reference in zip(prompts, ours, full):
        hf, _ = _hf_generate(ref, prompt, STEPS)
        hf = hf.tolist()
        hf = hf[:hf.index(STOP)] if STOP in hf else hf
        assert len(hf) > WINDOW or len(prompt) > WINDOW
        np.testing.assert_array_equal(mine.tokens, hf)
        np.testing.assert_array_equal(mine.tokens, reference.tokens)
        np.testing.assert_allclose(mine.letter_logprobs, reference.letter_logprobs, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_rings_on_a_seq_mesh(checkpoint):
    """Static batches on a mesh with a seq axis (ring-attention prefill of zigzagged prompts, the rings filled
    from tokens spread over the seq devices): the tokens and letter log-probs of one device."""
    from longrm_jax.parallel.mesh import make_mesh

    _, path = checkpoint
    prompts = _prompts()
    kwargs = dict(pad_id=0, stop_ids=[STOP], max_new_tokens=STEPS, letter_ids=[5, 6], batch_size=4)
    single = GreedyGenerator(load_pretrained(path, dtype="float32"), **kwargs).generate(prompts, progress=False)
    mesh = make_mesh(seq=2)  # fsdp fills the other devices
    sharded = GreedyGenerator(load_pretrained(path, dtype="float32", mesh=mesh), mesh=mesh, **kwargs)
    for ours, reference in zip(sharded.generate(prompts, progress=False), single):
        np.testing.assert_array_equal(ours.tokens, reference.tokens)
        np.testing.assert_allclose(ours.letter_logprobs, reference.letter_logprobs, rtol=1e-4, atol=1e-5)


def test_slot_plan_counts_the_rings(checkpoint):
    """A slot's cache bytes: the global layer at every column, the six local ones at the window's 16 slots; the
    plan fits more slots than with full-length local layers."""
    _, path = checkpoint
    cfg = load_pretrained(path, dtype="float32").config
    columns = 4096
    per_layer_column = 2 * 2 * 16 * 4  # K and V, 2 kv heads of 16, fp32
    assert kv_cache_bytes(cfg, columns) == columns * (per_layer_column + 8) + 6 * WINDOW * per_layer_column + 8 * WINDOW
    assert kv_cache_bytes(cfg, columns, window_rings=False) == columns * (7 * per_layer_column + 8)
    assert kv_cache_bytes(cfg, WINDOW) == kv_cache_bytes(cfg, WINDOW, window_rings=False)
    plan = plan_slots(cfg, 0, columns, 64 << 20)
    full = plan_slots(cfg, 0, columns, 64 << 20, window_rings=False)
    assert plan["per_slot"] - 3 * 4 * VOCAB == kv_cache_bytes(cfg, columns)
    assert plan["slots"] > full["slots"]
