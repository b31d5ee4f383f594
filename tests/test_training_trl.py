"""Our training objectives against TRL's trainers (``trl``): the same rows, the same tiny HF weights, the loss
and every gradient within 1e-5.

* ours: records -> our tokenizer, packing and gradient program (``test_training_reference.ours``), weights loaded
  from the tiny HF checkpoint;
* TRL: its own trainers built on the same checkpoint (``CPOTrainer`` with ``loss_type="simpo"``,
  ``RewardTrainer``, ``SFTTrainer``), each batch's loss taken from the trainer's ``compute_loss`` and its
  gradients from torch's backward. TRL gets the token ids upstream's datasets build (the independent
  tokenization of test_training_reference.py), padded on the right, prompt and padding labelled -100.

What the mapping says for a user coming from TRL (docs/upstream.md, "TRL's trainers"):
* ``CPOConfig(loss_type="simpo", beta=b, simpo_gamma=g, label_smoothing=e, cpo_alpha=a)`` is ``stage=simpo
  loss.beta=b loss.gamma=g loss.label_smoothing=e loss.nll_weight=a`` (TRL's NLL is a token mean over the batch's
  chosen responses, ours a mean over pairs of each one's token mean: equal for one pair per step). TRL's
  ``loss_type="hinge"`` is CPO's, on summed log-probs; ours (``loss.loss_type=hinge``) is SimPO's, on mean ones.
* ``RewardConfig(center_rewards_coefficient=c)`` with a ``margin`` column of m is ``stage=bt
  loss.center_rewards_coefficient=c loss.margin=m`` (ours: one margin for every pair).
* ``SFTTrainer`` (completion-only loss: one token mean over the batch) is ``stage=sft
  loss.reduction=global_tokens``; upstream's default, the mean of per-sample token means, differs.
TRL takes one rejected response per pair, so every case here has one.
"""

import json
import os

import numpy as np
import pytest

import torch
import transformers
import trl

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from trl.experimental.cpo import CPOConfig, CPOTrainer  # noqa: E402  (CPO lives in trl.experimental since 1.0)

from conftest import needs_upstream_rows  # noqa: E402
from longrm_jax.data.readers import read_records  # noqa: E402
from test_training_reference import (  # noqa: E402, F401 (checkpoints: the module fixture)
    REAL_SEQ_LEN, SFT_DIR, SIMPO_DIR, SYNTHETIC_PACKED_ROW, _assert_equal, _config, _hf_tokenizer, _read_upstream,
    _synthetic_files, _upstream_sequence, checkpoints, ours)

BETA, GAMMA = 2.5, 0.5


def _trainer_args(tmp_path):
    return dict(output_dir=str(tmp_path / "trl"), report_to=[], use_cpu=True, save_strategy="no",
                logging_strategy="no")


def _padded(seqs, value):
    width = max(len(s) for s in seqs)
    return torch.stack([torch.cat([s, torch.full((width - len(s),), value, dtype=s.dtype)]) for s in seqs])


def _batch(sequences):
    """input_ids, attention_mask, labels of right-padded sequences (pad id 0, labels -100 off the response)."""
    ids = [s for s, _ in sequences]
    labels = [torch.where(mask.bool(), s, torch.full_like(s, -100)) for s, mask in sequences]
    return _padded(ids, 0), _padded([torch.ones_like(s) for s in ids], 0), _padded(labels, -100)


def _sequences(rows, stage, seq_len):
    """Upstream's token ids and response masks: per row [prompt+golden] (SFT) or [chosen, first rejected]."""
    tok = _hf_tokenizer()
    out = []
    for row in rows:
        prompt = [dict(m) for m in row["chat_template"]]
        if stage == "sft":
            prompt = [m for m in prompt if m["role"] != "assistant"]
            out.append([_upstream_sequence(tok, prompt, row["golden"], seq_len, preference=False)])
        else:
            out.append([_upstream_sequence(tok, prompt, r, seq_len, preference=True)
                        for r in (row["chosen"], row["rejects"][0])])
    return out


def _trl_step(trainer, inputs):
    """(loss, {HF name: gradient}) of one TRL ``compute_loss`` and backward."""
    model = trainer.model
    model.train()
    model.zero_grad()
    loss = trainer.compute_loss(model, inputs)
    loss.backward()
    return loss.item(), {name: p.grad.detach().numpy().copy() for name, p in model.named_parameters()}


def trl_simpo(path, rows, seq_len, tmp_path, **cpo):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    trainer = CPOTrainer(model=model, args=CPOConfig(beta=BETA, **cpo, **_trainer_args(tmp_path)),
                         train_dataset=_placeholder_pairs(), processing_class=_hf_tokenizer())
    pairs = _sequences(rows, "simpo", seq_len)
    inputs = {}
    for side, column in (("chosen", 0), ("rejected", 1)):
        ids, attention, labels = _batch([p[column] for p in pairs])
        inputs.update({f"{side}_input_ids": ids, f"{side}_attention_mask": attention, f"{side}_labels": labels})
    return _trl_step(trainer, inputs)


def trl_reward(path, rows, seq_len, tmp_path, margin, center):
    model = transformers.AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
    trainer = trl.RewardTrainer(model=model, args=trl.RewardConfig(center_rewards_coefficient=center,
                                                                  **_trainer_args(tmp_path)),
                                train_dataset=_placeholder_pairs(), processing_class=_hf_tokenizer())
    pairs = _sequences(rows, "bt", seq_len)
    ids, attention, _ = _batch([p[0] for p in pairs] + [p[1] for p in pairs])
    inputs = {"input_ids": ids, "attention_mask": attention, "margin": torch.full((len(pairs),), margin)}
    return _trl_step(trainer, inputs)


def trl_sft(path, rows, seq_len, tmp_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    import datasets

    trainer = trl.SFTTrainer(model=model, args=trl.SFTConfig(**_trainer_args(tmp_path)),
                             train_dataset=datasets.Dataset.from_list([{"prompt": "a", "completion": " b"}]),
                             processing_class=_hf_tokenizer())
    ids, attention, labels = _batch([s[0] for s in _sequences(rows, "sft", seq_len)])
    return _trl_step(trainer, {"input_ids": ids, "attention_mask": attention, "labels": labels})


def _placeholder_pairs():
    """TRL's trainers want a train dataset at construction; the batches compared are built above, not from it."""
    import datasets

    return datasets.Dataset.from_list([{"prompt": "a", "chosen": " b", "rejected": " c"}])


# ------------------------------------------------------------------------------------------------------------
# Cases: (id, stage, layout, our overrides, TRL's settings, rows: "synthetic" | "real" | "one")
# ------------------------------------------------------------------------------------------------------------
CASES = [
    ("simpo-rows-smoothed", "simpo", "rows", ["loss.label_smoothing=0.1"],
     dict(loss_type="simpo", simpo_gamma=GAMMA, label_smoothing=0.1, cpo_alpha=0.0), "synthetic"),
    ("simpo-packed", "simpo", "packed", [], dict(loss_type="simpo", simpo_gamma=GAMMA, cpo_alpha=0.0), "synthetic"),
    ("simpo-nll-one-pair", "simpo", "rows", ["loss.nll_weight=0.5"],
     dict(loss_type="simpo", simpo_gamma=GAMMA, cpo_alpha=0.5), "one"),
    ("simpo-real", "simpo", "packed", [], dict(loss_type="simpo", simpo_gamma=GAMMA, cpo_alpha=0.0), "real"),
    ("bt-rows-margin-centered", "bt", "rows", ["loss.margin=0.3", "loss.center_rewards_coefficient=0.01"],
     dict(margin=0.3, center=0.01), "synthetic"),
    ("bt-real", "bt", "packed", [], dict(margin=0.0, center=None), "real"),
    ("sft-global-tokens", "sft", "packed", ["loss.reduction=global_tokens"], {}, "synthetic"),
    ("sft-real-global-tokens", "sft", "packed", ["loss.reduction=global_tokens"], {}, "real"),
]


def _rows_and_records(source, stage, tmp_path):
    kind = "sft" if stage == "sft" else "preference"
    if source == "real":
        directory = SFT_DIR if stage == "sft" else SIMPO_DIR
        rows = _read_upstream(directory, ("eval", "test"))
        records = [r for split in ("eval", "test") for r in read_records(directory, kind, split=split)]
        return rows, records, REAL_SEQ_LEN
    pref_rows, sft_rows, files = _synthetic_files(tmp_path, 6)
    rows = sft_rows if stage == "sft" else pref_rows
    records = list(read_records(str(files[kind]), kind))
    if source == "one":
        rows, records = rows[:1], records[:1]
    return rows, records, SYNTHETIC_PACKED_ROW


@pytest.mark.slow
@pytest.mark.parametrize("case", [pytest.param(c, id=c[0], marks=needs_upstream_rows if c[-1] == "real" else ())
                                  for c in CASES])
def test_ours_equals_trls_trainer(case, checkpoints, tmp_path):
    _, stage, layout, overrides, trl_settings, source = case
    path, _ = checkpoints["classifier" if stage == "bt" else "causal_lm"]
    rows, records, seq_len = _rows_and_records(source, stage, tmp_path)
    rejects = 0 if stage == "sft" else 1
    k = 1 + rejects
    batch_rows = k * len(rows) if layout == "rows" else len(rows)
    # data.seq_len caps each sequence; a packed row holds k of them. The real rows are cut to REAL_SEQ_LEN as the
    # reference test cuts them; the synthetic ones (78 tokens) are not cut, and k per row lets groups share a row.
    row_len = seq_len * k if layout == "packed" and source != "real" else seq_len
    cfg = _config(stage, path, layout, rejects, row_len, [f"data.batch_rows={batch_rows}", *overrides])
    got, _ = ours(cfg, records)
    if stage == "simpo":
        expected = trl_simpo(path, rows, row_len, tmp_path, **trl_settings)
    elif stage == "bt":
        expected = trl_reward(path, rows, row_len, tmp_path, **trl_settings)
    else:
        expected = trl_sft(path, rows, row_len, tmp_path)
    _assert_equal(got, expected)


@pytest.mark.slow
def test_upstream_sft_reduction_differs_from_trls(checkpoints, tmp_path):
    """Upstream's SFT (the default, loss.reduction=upstream) weighs each sample equally; TRL weighs each token:
    they differ once the responses' lengths do (here one of three is four times as long)."""
    path, _ = checkpoints["causal_lm"]
    _, rows, _ = _synthetic_files(tmp_path, 3)
    rows[0]["golden"] = " ".join([rows[0]["golden"]] * 4)
    file = tmp_path / "uneven_sft.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = list(read_records(str(file), "sft"))
    seq_len = 2 * SYNTHETIC_PACKED_ROW
    cfg = _config("sft", path, "packed", 0, seq_len, [f"data.batch_rows={len(rows)}"])
    (loss, _), _ = ours(cfg, records)
    trl_loss, _ = trl_sft(path, rows, seq_len, tmp_path)
    assert abs(loss - trl_loss) > 1e-4 * trl_loss, (loss, trl_loss)
