"""fp32 parity of our decoder against transformers (torch, CPU) on tiny random checkpoints.

Cases are chosen so every axis is covered at least once per family without the full product: both families
x each RoPE type, with GQA 1:1 / 4:1 and tied / untied spread over them. Every case checks a right-padded
batch (valid positions only) and a packed row against the same sequences run alone.
"""

import numpy as np
import pytest

import torch  # the test extra installs it: a broken install fails the run, never skips
import transformers  # noqa: F401

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from longrm_jax import load_pretrained  # noqa: E402
from helpers.family_parity import TOL, rel_err, right_padded  # noqa: E402
from helpers.tiny_checkpoint import make_tiny_checkpoint  # noqa: E402

CAUSAL_CASES = [
    # family, rope, kv_heads (of 4 query heads), tied
    ("llama", "default", 4, False),
    ("llama", "linear", 1, True),
    ("llama", "llama3", 1, False),
    ("llama", "yarn", 4, True),
    ("qwen3", "default", 1, True),
    ("qwen3", "linear", 4, False),
    ("qwen3", "llama3", 4, True),
    ("qwen3", "yarn", 1, False),
]


@pytest.mark.parametrize("family,rope,kv_heads,tied", CAUSAL_CASES, ids=lambda v: str(v))
def test_causal_lm_parity(tmp_path, family, rope, kv_heads, tied):
    ref_model = make_tiny_checkpoint(tmp_path, family, rope=rope, kv_heads=kv_heads, tied=tied)
    model = load_pretrained(tmp_path)
    assert model.config.tie_word_embeddings == tied and model.config.rope_type == rope
    rng = np.random.default_rng(0)
    forward = jax.jit(lambda m, ids, pos, seg: m(ids, pos, seg))

    # Right-padded batch: compare the valid positions. Lengths reach past YaRN / llama3's original length 64.
    lengths = [80, 37, 5]
    ids, mask = right_padded(rng, lengths, 80, 256)
    with torch.no_grad():
        ref = ref_model(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    seg = mask.astype(np.int32)
    pos = np.broadcast_to(np.arange(80, dtype=np.int32), ids.shape)
    ours = np.asarray(forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(pos), jnp.asarray(seg)))
    valid = mask.astype(bool)
    assert rel_err(ours[valid], ref[valid]) <= TOL

    # Packed row: three sequences in one row (+ padding) equal each sequence run alone (by HF).
    pieces = [rng.integers(3, 256, n) for n in (30, 17, 25)]
    width = 80
    packed = np.zeros((1, width), np.int32)
    seg = np.zeros((1, width), np.int32)
    pos = np.zeros((1, width), np.int32)
    start = 0
    for s, piece in enumerate(pieces, 1):
        packed[0, start:start + len(piece)] = piece
        seg[0, start:start + len(piece)] = s
        pos[0, start:start + len(piece)] = np.arange(len(piece))
        start += len(piece)
    ours = np.asarray(forward(model, jnp.asarray(packed), jnp.asarray(pos), jnp.asarray(seg)))
    start = 0
    for piece in pieces:
        with torch.no_grad():
            ref = ref_model(torch.tensor(piece[None])).logits.numpy()[0]
        assert rel_err(ours[0, start:start + len(piece)], ref) <= TOL
        start += len(piece)


@pytest.mark.parametrize("family,kv_heads,num_labels", [("llama", 1, 1), ("qwen3", 4, 3)])
def test_classifier_parity(tmp_path, family, kv_heads, num_labels):
    ref_model = make_tiny_checkpoint(tmp_path, family, "classifier", kv_heads=kv_heads, num_labels=num_labels,
                                     rope="yarn" if family == "qwen3" else "llama3")
    model = load_pretrained(tmp_path)
    assert type(model).__name__ == "SequenceClassifier" and model.config.num_labels == num_labels
    rng = np.random.default_rng(1)
    ids, mask = right_padded(rng, [40, 9, 1, 23], 40, 256)
    with torch.no_grad():
        ref = ref_model(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    ours = np.asarray(jax.jit(lambda m, i, s: m(i, segment_ids=s))(model, jnp.asarray(ids, jnp.int32),
                                                                 jnp.asarray(mask, jnp.int32)))
    assert ours.shape == (4, num_labels)
    assert rel_err(ours, ref) <= TOL

    # token_scores at each row's last valid token equals the pooled score.
    scores = np.asarray(model.token_scores(jnp.asarray(ids, jnp.int32), segment_ids=jnp.asarray(mask, jnp.int32)))
    last = np.asarray([39, 8, 0, 22])
    np.testing.assert_allclose(scores[np.arange(4), last], ours, rtol=1e-5, atol=1e-6)


def test_classifier_without_pad_token_matches_hf(tmp_path):
    """HF pools the last token when pad_token_id is None, and refuses batches > 1; so do we."""
    ref_model = make_tiny_checkpoint(tmp_path, "llama", "classifier", pad_token_id=None)
    model = load_pretrained(tmp_path)
    ids = np.random.default_rng(2).integers(3, 256, (1, 12))
    with torch.no_grad():
        ref = ref_model(torch.tensor(ids)).logits.numpy()
    assert rel_err(model(jnp.asarray(ids, jnp.int32)), ref) <= TOL
    with pytest.raises(ValueError, match="no padding token|pad_token_id"):
        model(jnp.asarray(np.concatenate([ids, ids]), jnp.int32))


def test_llama_biases_and_independent_head_dim(tmp_path):
    """Llama's optional attention / MLP biases and a head_dim != hidden / heads map and run like HF."""
    ref_model = make_tiny_checkpoint(tmp_path, "llama", kv_heads=1, head_dim=32, attention_bias=True, mlp_bias=True)
    model = load_pretrained(tmp_path)
    assert model.config.attention_bias and model.config.mlp_bias and model.config.head_dim == 32
    ids = np.random.default_rng(3).integers(3, 256, (2, 20))
    with torch.no_grad():
        ref = ref_model(torch.tensor(ids)).logits.numpy()
    assert rel_err(jax.jit(lambda m, i: m(i))(model, jnp.asarray(ids, jnp.int32)), ref) <= TOL
