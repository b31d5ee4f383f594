"""Parity checks shared by the per-family model tests (tests/test_models_<family>.py): a tiny random HF model
of any transformers class written to a directory, our load of it compared with transformers (fp32, PyTorch
CPU) on a right-padded batch and on a packed row, the score head's pooling, and the export round trip.
"""

from __future__ import annotations

import json
import os

import numpy as np

TOL = 1e-4


def rel_err(ours, theirs) -> float:
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    return float(np.linalg.norm(ours - theirs) / np.linalg.norm(theirs))


def make_model(cls_name: str, config, out_dir=None, seed: int = 0):
    """``transformers.<cls_name>(config)`` with O(0.1) random weights (norm weights ~1: HF's own init leaves
    activations so small that a wrong RoPE or norm hides in the noise), in eval mode, saved to ``out_dir``."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            param.copy_((1 + 0.1 * noise) if "norm" in name else 0.1 * noise)
    model = model.eval()
    if out_dir is not None:
        model.save_pretrained(os.fspath(out_dir))
    return model


def right_padded(rng, lengths, width, vocab, pad=0):
    ids = np.full((len(lengths), width), pad, np.int64)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(3, vocab, n)  # never the pad id inside a sequence
    mask = (np.arange(width)[None] < np.asarray(lengths)[:, None]).astype(np.int64)
    return ids, mask


def check_causal_lm(model, ref_model, vocab: int, width: int = 40, seed: int = 0):
    """Logits of a right-padded batch (valid positions) and of a packed row (each piece against HF run alone)."""
    import jax
    import jax.numpy as jnp
    import torch

    rng = np.random.default_rng(seed)
    forward = jax.jit(lambda m, ids, pos, seg: m(ids, pos, seg))
    ids, mask = right_padded(rng, [width, width // 2 - 3, 4], width, vocab)
    with torch.no_grad():
        ref = ref_model(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.float().numpy()
    pos = np.broadcast_to(np.arange(width, dtype=np.int32), ids.shape)
    ours = np.asarray(forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(pos), jnp.asarray(mask, jnp.int32)))
    valid = mask.astype(bool)
    assert rel_err(ours[valid], ref[valid]) <= TOL, rel_err(ours[valid], ref[valid])

    lengths = (width // 2, width // 4, width // 4 - 2)
    pieces = [rng.integers(3, vocab, n) for n in lengths]
    packed, seg, pos = (np.zeros((1, width), np.int32) for _ in range(3))
    start = 0
    for s, piece in enumerate(pieces, 1):
        packed[0, start:start + len(piece)], seg[0, start:start + len(piece)] = piece, s
        pos[0, start:start + len(piece)] = np.arange(len(piece))
        start += len(piece)
    ours = np.asarray(forward(model, jnp.asarray(packed), jnp.asarray(pos), jnp.asarray(seg)))
    start = 0
    for piece in pieces:
        with torch.no_grad():
            ref = ref_model(torch.tensor(piece[None])).logits.float().numpy()[0]
        assert rel_err(ours[0, start:start + len(piece)], ref) <= TOL
        start += len(piece)


def check_classifier(model, ref_model, vocab: int, num_labels: int, width: int = 24, seed: int = 1):
    """Scores of a right-padded batch (HF pools the last non-pad token) and ``token_scores`` at those tokens."""
    import jax
    import jax.numpy as jnp
    import torch

    lengths = [width, width // 3, 1, width - 5]
    ids, mask = right_padded(np.random.default_rng(seed), lengths, width, vocab)
    with torch.no_grad():
        ref = ref_model(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.float().numpy()
    ours = np.asarray(jax.jit(lambda m, i, s: m(i, segment_ids=s))(model, jnp.asarray(ids, jnp.int32),
                                                                 jnp.asarray(mask, jnp.int32)))
    assert ours.shape == (len(lengths), num_labels)
    assert rel_err(ours, ref) <= TOL, rel_err(ours, ref)
    scores = np.asarray(model.token_scores(jnp.asarray(ids, jnp.int32), segment_ids=jnp.asarray(mask, jnp.int32)))
    last = np.asarray(lengths) - 1
    np.testing.assert_allclose(scores[np.arange(len(lengths)), last], ours, rtol=1e-5, atol=1e-6)


def check_round_trip(model, out_dir, ref_model, auto_cls: str, vocab: int, *, architecture: str | None = None,
                     exact: bool = True):
    """Our export loads in transformers without missing / unexpected keys and gives HF's outputs exactly
    (``exact=False``: to float32 rounding, where the reference is another HF class, e.g. the multimodal one)."""
    import torch
    import transformers

    from longrm_jax.hf.save import save_pretrained

    save_pretrained(model, out_dir, progress=False)
    config = json.loads((out_dir / "config.json").read_text())
    if architecture:
        assert config["architectures"] == [architecture]
    reloaded, info = getattr(transformers, auto_cls).from_pretrained(out_dir, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ids = torch.randint(3, vocab, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = reloaded.eval()(ids, attention_mask=torch.ones_like(ids)).logits.float().numpy()
        theirs = ref_model(ids, attention_mask=torch.ones_like(ids)).logits.float().numpy()
    if exact:
        np.testing.assert_array_equal(ours, theirs)
    else:
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    return reloaded
