"""The DisRM LoRA step against peft, as upstream trains it (``train/utils/lora.py``: ``LoraConfig(r, lora_alpha,
target_modules="all-linear", lora_dropout=0, task_type=CAUSAL_LM, bias="none")`` injected into the
``AutoModelForSequenceClassification``).

* peft's "all-linear" under ``CAUSAL_LM`` adapts the 7 projections of every layer and the ``score`` head, and trains
  nothing else: the same parameter set as ``configs/llama31_8b_disrm_bt.yaml`` (``lora.targets=[all-linear,
  score]``, ``lora.train_modules=[]``).
* With the same adapter values in both (B nonzero, so every adapter gets a gradient), the Bradley-Terry loss and
  the gradient of every ``lora_A`` / ``lora_B`` agree within 1e-5 and 2e-5; rank 4 with alpha 8 checks the alpha / r
  scale (upstream's 8 / 8 is 1).
* The merged weights (what ``python -m longrm_jax.export`` writes for a LoRA run) equal peft's
  ``merge_and_unload()``.

The reference side is transformers + peft on upstream's tokenization (test_training_reference's independent
stack); ours is the trainer's gradient program on our own batches of the same rows.
"""

import jax
import jax.numpy as jnp
import numpy as np
import peft
import pytest
import torch
import transformers

from helpers.tiny_checkpoint import make_tiny_checkpoint
from longrm_jax.data.readers import read_records
from longrm_jax.hf.save import hf_tensors
from longrm_jax.parallel.mesh import make_mesh
from longrm_jax.training import batches as batch_lib
from longrm_jax.training.data_source import load_tokenizer, packed_batches
from longrm_jax.training.lora import effective_params
from longrm_jax.training.model_setup import load_model
from longrm_jax.training.state import TrainState, lr_schedule, make_optimizer, split_trainable
from longrm_jax.training.steps import StageSpec, make_train_step
from test_training_reference import (SYNTHETIC_PACKED_ROW, _config, _hf_tokenizer, _last_score, _synthetic_files,
                                     _upstream_sequence)

RANK, ALPHA = 4, 8.0
TOL = 1e-5
GRAD_TOL = 2e-5  # relative, by norm: fp32 rounding of two stacks (the largest seen: 1.0e-5, o_proj's B)
MODULE_OF = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
             "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    path = tmp_path_factory.mktemp("peft_classifier")
    make_tiny_checkpoint(path, "llama", head="classifier", vocab_size=650, pad_token_id=0, hidden_size=32, heads=2,
                         kv_heads=1, layers=2)
    return str(path)


def _peft_model(path):
    model = transformers.AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules="all-linear", lora_dropout=0.0,
                             task_type=peft.TaskType.CAUSAL_LM, bias="none")
    # upstream: get_peft_model(model, config); under transformers 5 its CAUSAL_LM wrapper wants a generation
    # method a classifier lacks, so the adapters are injected the same way without the wrapper.
    return peft.inject_adapter_in_model(config, model).train()


def _peft_modules(model, key):
    """[(layer index or None, peft LoRA module)] for one of our adapted weights ("model/layers/q_proj", "score")."""
    if key == "score":
        return [(None, model.score)]
    name = key.rsplit("/", 1)[-1]
    return [(i, getattr(getattr(layer, MODULE_OF[name]), name)) for i, layer in enumerate(model.model.layers)]


def _ours(cfg, records, rows):
    """(loss, adapter gradients, trainable, frozen, model config) of our LoRA step, B drawn at random."""
    tok = load_tokenizer(cfg.data)
    mesh = make_mesh(1, 1, 1, 1, devices=jax.devices()[:1])
    mcfg, codec, values = load_model(cfg, mesh, tok)
    trainable, frozen = split_trainable(cfg.lora, codec, values, jax.random.key(0))
    rng = np.random.default_rng(1)
    trainable = {k: jnp.asarray(rng.normal(0, 0.2, v.shape), jnp.float32) if k.endswith("/lora_b") else v
                 for k, v in trainable.items()}
    host = packed_batches(cfg, tok, records, sft=False, batch_rows=cfg.data.batch_rows)
    assert len(host) == 1 and int(host[0]["num_groups"].sum()) == len(rows)
    spec = StageSpec("bt", 1, 1, slotted=True)
    step = make_train_step(cfg, codec, make_optimizer(cfg.optim, 10), spec, lr_schedule(cfg.optim, 10))
    state = TrainState(jnp.zeros((), jnp.int32), trainable, frozen, None)
    grads, aux = jax.jit(step.gradients)(state, jax.tree.map(jnp.asarray, batch_lib.prepare(host[0], slots=2)))
    return float(aux["objective"]), {k: np.asarray(v) for k, v in grads.items()}, trainable, frozen, mcfg


def _reference(model, rows, seq_len):
    tok = _hf_tokenizer()
    model.zero_grad()
    losses = []
    for row in rows:
        prompt = [dict(m) for m in row["chat_template"]]
        scores = [_last_score(model, _upstream_sequence(tok, prompt, r, seq_len, preference=True)[0])
                  for r in (row["chosen"], row["rejects"][0])]
        losses.append(-torch.nn.functional.logsigmoid(scores[0] - scores[1]))
    loss = torch.stack(losses).mean()
    loss.backward()
    return loss.item()


@pytest.mark.slow
def test_disrm_lora_step_equals_peft(classifier, tmp_path):
    rows, _, files = _synthetic_files(tmp_path, 4)
    records = list(read_records(str(files["preference"]), "preference"))
    cfg = _config("bt", classifier, "rows", 1, SYNTHETIC_PACKED_ROW,
                  [f"data.batch_rows={2 * len(rows)}", f"lora.rank={RANK}", f"lora.alpha={ALPHA}",
                   "lora.targets=[all-linear, score]", "lora.train_modules=[]"])
    loss, grads, trainable, frozen, mcfg = _ours(cfg, records, rows)

    model = _peft_model(classifier)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    adapted = sorted(k[: -len("/lora_a")] for k in trainable if k.endswith("/lora_a"))
    assert set(trainable) == {k + s for k in adapted for s in ("/lora_a", "/lora_b")}  # adapters only
    assert len(trained) == 2 * sum(len(_peft_modules(model, k)) for k in adapted)  # peft's set is ours
    with torch.no_grad():
        for key in adapted:
            a, b = np.asarray(trainable[key + "/lora_a"]), np.asarray(trainable[key + "/lora_b"])
            for layer, module in _peft_modules(model, key):
                pick = (lambda x: x) if layer is None else (lambda x, i=layer: x[i])
                module.lora_A["default"].weight.copy_(torch.from_numpy(pick(a).T.copy()))
                module.lora_B["default"].weight.copy_(torch.from_numpy(pick(b).T.copy()))
    ref_loss = _reference(model, rows, SYNTHETIC_PACKED_ROW)

    np.testing.assert_allclose(loss, ref_loss, rtol=TOL)
    errors = {}
    for key in adapted:
        for side, attr in (("/lora_a", "lora_A"), ("/lora_b", "lora_B")):
            got = grads[key + side]
            for layer, module in _peft_modules(model, key):
                ref = getattr(module, attr)["default"].weight.grad.numpy().T
                mine = got if layer is None else got[layer]
                err = np.linalg.norm(mine - ref) / max(np.linalg.norm(ref), 1e-30)
                errors[f"{key}{side}[{layer}]"] = err
    assert max(errors.values()) <= GRAD_TOL, errors

    # export: our merged weights (W + alpha / r A @ B) are peft's merge_and_unload()
    merged = effective_params(trainable, frozen, alpha=ALPHA, rank=RANK)
    ours_hf = dict(hf_tensors({tuple(k.split("/")): np.asarray(v) for k, v in merged.items()}, mcfg))
    with torch.no_grad():
        for module in model.modules():  # what merge_and_unload() does, layer by layer (peft's own merge)
            if isinstance(module, peft.tuners.lora.LoraLayer):
                module.merge()
    theirs = {k.replace(".base_layer.", "."): v.detach().numpy() for k, v in model.state_dict().items()
              if ".lora_" not in k}
    assert set(ours_hf) == set(theirs)
    for name, ref in theirs.items():
        np.testing.assert_allclose(ours_hf[name], ref, rtol=1e-5, atol=1e-6, err_msg=name)
