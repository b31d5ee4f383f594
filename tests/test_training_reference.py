"""The training objective against an independent stack (issue 32): the same rows through

* ours: records -> ``ChatTokenizer`` -> ``packed_batches`` -> ``batches.prepare`` -> the trainer's gradient
  program (``steps.make_train_step``), weights loaded from a tiny HF checkpoint;
* a reference sharing no code with it: transformers (torch) with the same tiny random weights, each sequence
  run alone, the rows tokenized as upstream's datasets do (``train/dataset/sft.py``, ``preference.py``: the text
  ``(prompt + response).rstrip("\\n")``, the loss mask from the templated prompt's token count, ``" " + eos`` as
  text when missing) and the losses written from upstream's public formulas (``train/trainer/sft.py``,
  ``simpo.py``, ``train/model/rl.py``, ``rm.py``): SFT the mean over samples of each one's token-mean NLL (one
  sample per upstream micro-step), SimPO ``-log s(beta (pi_c - mean pi_r) - gamma)`` with pi the mean
  response-token log-prob, Bradley-Terry ``-log s(r_c - mean r_r)`` with r the score at the last token, each
  the mean over the pairs of one bucket (grad_accum 1: the step is one bucket).

Rows: the real upstream rows (``shared/data/longrm_upstream``, skipped where absent as in
test_data_upstream_rows.py) and synthetic ones, with the bundled tiny tokenizer. The real prompts are tens of
thousands of tokens, so both stacks cut each sequence to ``seq_len`` by the ``prompt_middle`` rule
(docs/upstream.md "Training data"; written again here): the response kept (right-cut with EOS forced when it
alone overflows), the prompt's first and last halves of the room left. fp32; the loss and every gradient
tensor agree to 1e-5 (relative, by norm).
"""

import functools
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from conftest import UPSTREAM_DATA, needs_upstream_rows  # noqa: E402
from helpers.tiny_checkpoint import make_tiny_checkpoint  # noqa: E402
from longrm_jax.data import synthetic  # noqa: E402
from longrm_jax.data.packing import PackedRow, rows_to_batch  # noqa: E402
from longrm_jax.data.readers import read_records  # noqa: E402
from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR  # noqa: E402
from longrm_jax.data.tokenize import TruncationConfig  # noqa: E402
from longrm_jax.hf.save import hf_tensors  # noqa: E402
from longrm_jax.parallel.mesh import make_mesh  # noqa: E402
from longrm_jax.train import DEFAULT_CONFIG  # noqa: E402
from longrm_jax.training import batches as batch_lib  # noqa: E402
from longrm_jax.training.config import load_config  # noqa: E402
from longrm_jax.training.data_source import load_tokenizer, packed_batches  # noqa: E402
from longrm_jax.training.model_setup import load_model  # noqa: E402
from longrm_jax.training.state import TrainState, lr_schedule, make_optimizer  # noqa: E402
from longrm_jax.training.steps import StageSpec, make_train_step  # noqa: E402

SFT_DIR = os.path.join(UPSTREAM_DATA, "SFT_Data_Sampled20")
SIMPO_DIR = os.path.join(UPSTREAM_DATA, "SimPO_Data_Sampled20")
BETA, GAMMA = 2.5, 0.5  # upstream's SimPO script values
TOL = 1e-5
REAL_SEQ_LEN = 160  # the real sequences are cut to it (prompt_middle); the synthetic ones (78 tokens) are not
SYNTHETIC_PACKED_ROW = 160  # x (1 + rejected): two synthetic groups share a packed row


# ------------------------------------------------------------------------------------------------------------
# The independent stack: transformers + upstream's tokenization and formulas, nothing of this package.
# ------------------------------------------------------------------------------------------------------------
@functools.cache
def _hf_tokenizer():
    return transformers.AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR)


@functools.lru_cache(maxsize=256)
def _encode(text):
    """tokenizer(text, add_special_tokens=False) input ids, through the Rust tokenizer (the real prompts are tens of
    thousands of tokens; the Python wrapper is ~5x slower) and cached across cases (the same rows recur)."""
    return tuple(_hf_tokenizer().backend_tokenizer.encode(text, add_special_tokens=False).ids)


def _upstream_sequence(tok, prompt, response, seq_len, preference):
    """(ids, loss mask) of one sequence as upstream's dataset builds it, then cut to ``seq_len`` (prompt_middle)."""
    prompt_text = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template(prompt + [{"role": "assistant", "content": response}], tokenize=False)
    response_text = full[len(prompt_text):]
    prompt_len = len(_encode(prompt_text))
    text = (prompt_text + response_text).rstrip("\n")
    if not text.endswith(tok.eos_token):
        text += " " + tok.eos_token
    ids = list(_encode(text))
    ids[-1] = tok.eos_token_id
    mask = [0] * prompt_len + [1] * (len(ids) - prompt_len)
    if preference:
        mask[-1] = 1
    if len(ids) > seq_len:
        response_len = len(ids) - prompt_len
        keep = min(prompt_len, max(seq_len - response_len, seq_len // 8))
        head = keep // 2
        kept_response = min(response_len, seq_len - keep)
        ids = ids[:head] + ids[prompt_len - (keep - head):prompt_len] + ids[prompt_len:prompt_len + kept_response]
        mask = [0] * keep + [1] * kept_response
        if kept_response < response_len:
            ids[-1] = tok.eos_token_id
    return torch.tensor(ids), torch.tensor(mask, dtype=torch.float32)


def _token_logps(model, ids):
    logits = model(ids[None]).logits[0].float()
    return torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None])[:, 0]


def _mean_logp(model, ids, mask):
    """SimPO's pi: the sequence's masked log-probs over its trained tokens (upstream: (seq @ mask) / mask.sum())."""
    shifted = mask[1:]
    return (_token_logps(model, ids) * shifted).sum() / shifted.sum()


def _last_score(model, ids):
    """Bradley-Terry's r: the head at the sequence's last token (upstream: rewards[0, start + seq_len - 1])."""
    hidden = model.model(ids[None]).last_hidden_state
    return model.score(hidden)[0, -1, 0].float()


def reference(model, tok, stage, rows, num_rejects, seq_len, backward=True):
    """(loss, {HF name: gradient}) of one optimizer step over ``rows`` (dicts of upstream's fields)."""
    model.zero_grad()
    losses = []
    for row in rows:
        prompt = [dict(m) for m in row["chat_template"]]
        if stage == "sft":
            prompt = [m for m in prompt if m["role"] != "assistant"]
            ids, mask = _upstream_sequence(tok, prompt, row["golden"], seq_len, preference=False)
            losses.append(-_mean_logp(model, ids, mask))
            continue
        responses = [row["chosen"], *row["rejects"][:num_rejects]]
        seqs = [_upstream_sequence(tok, prompt, r, seq_len, preference=True) for r in responses]
        if stage == "simpo":
            values = [_mean_logp(model, ids, mask) for ids, mask in seqs]
            z = BETA * (values[0] - torch.stack(values[1:]).mean()) - GAMMA
        else:
            values = [_last_score(model, ids) for ids, _ in seqs]
            z = values[0] - torch.stack(values[1:]).mean()
        losses.append(-torch.nn.functional.logsigmoid(z))
    loss = torch.stack(losses).mean()
    if not backward:
        return loss.item(), None
    loss.backward()
    return loss.item(), {name: p.grad.detach().numpy().copy() for name, p in model.named_parameters()}


# ------------------------------------------------------------------------------------------------------------
# Ours: the trainer's own path.
# ------------------------------------------------------------------------------------------------------------
def _config(stage, checkpoint, layout, num_rejects, seq_len, extra=()):
    overrides = [f"stage={stage}", f"model.init={checkpoint}", "model.compute_dtype=float32",
                 "model.param_dtype=float32", "model.remat=none", f"data.layout={layout}", f"data.num_rejects={num_rejects}",
                 f"data.seq_len={seq_len}", "data.shuffle=false", "grad_accum=1", f"loss.beta={BETA}",
                 f"loss.gamma={GAMMA}", "loss.nll_weight=0", "loss.label_smoothing=0", "loss.chunk_tokens=64",
                 *extra]
    return load_config(None, overrides, base=DEFAULT_CONFIG)


def _gradients(cfg, host, slots=None, max_groups=None):
    """(objective, {HF name: gradient}) of our gradient program on one host batch."""
    tok = load_tokenizer(cfg.data)
    mesh = make_mesh(1, 1, 1, 1, devices=jax.devices()[:1])
    mcfg, codec, values = load_model(cfg, mesh, tok)
    num_rejects = 0 if cfg.stage == "sft" else cfg.data.num_rejects
    groups = 1 if slots else max_groups or int(host["num_groups"].max())
    spec = StageSpec(cfg.stage, num_rejects, groups, slotted=slots is not None)
    step = make_train_step(cfg, codec, make_optimizer(cfg.optim, 10), spec, lr_schedule(cfg.optim, 10))
    state = TrainState(jnp.zeros((), jnp.int32), values, {}, None)
    batch = jax.tree.map(jnp.asarray, batch_lib.prepare(host, slots=slots))
    grads, aux = jax.jit(step.gradients)(state, batch)
    named = {tuple(k.split("/")): np.asarray(v) for k, v in grads.items()}
    return float(aux["objective"]), dict(hf_tensors(named, mcfg))


def ours(cfg, records):
    tok = load_tokenizer(cfg.data)
    k = 1 + cfg.data.num_rejects if cfg.data.layout == "rows" else None
    batches = packed_batches(cfg, tok, records, sft=cfg.stage == "sft", batch_rows=cfg.data.batch_rows)
    assert len(batches) == 1, "one optimizer step must hold every row"
    host = batches[0]
    assert int(host["num_groups"].sum()) == len(records)
    return _gradients(cfg, host, slots=k), host


def _assert_equal(got, expected):
    (loss, grads), (ref_loss, ref_grads) = got, expected
    assert np.isfinite(ref_loss) and ref_loss > 0
    np.testing.assert_allclose(loss, ref_loss, rtol=TOL)
    assert set(grads) == set(ref_grads)
    for name, ref in ref_grads.items():
        err = np.linalg.norm(grads[name] - ref) / max(np.linalg.norm(ref), 1e-30)
        assert err <= TOL, f"{name}: relative error {err:.2e}"


# ------------------------------------------------------------------------------------------------------------
# Rows and checkpoints
# ------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Tiny random HF checkpoints over the tiny tokenizer's 650 ids: a Qwen3 LM (SFT, SimPO), a Llama classifier
    (BT). fp32 torch models in training mode (no dropout in these architectures)."""
    out = {}
    for name, family, head in (("causal_lm", "qwen3", "causal_lm"), ("classifier", "llama", "classifier")):
        path = tmp_path_factory.mktemp(name)
        model = make_tiny_checkpoint(path, family, head=head, vocab_size=650, pad_token_id=0, hidden_size=32,
                                     heads=2, kv_heads=1, layers=1)
        out[name] = (str(path), model.float().train())
    return out


def _read_upstream(path, splits):
    import datasets

    return [dict(row) for split in splits for row in datasets.load_from_disk(path)[split]]


def _synthetic_files(tmp_path, n):
    rows = synthetic.training_rows(n, seed=3, lengths=[8, 20], num_rejects=2)
    paths = {}
    for name, items in (("preference", rows), ("sft", [synthetic.sft_row(r) for r in rows])):
        paths[name] = tmp_path / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in items))
    return rows, [synthetic.sft_row(r) for r in rows], paths


# stage, layout, rejected per group (the rows layout, one sequence per row, exists for preference stages only).
# Every stage runs on both kinds of rows; each (layout, rejected) of SimPO and BT on one of them (a case costs a
# compile: ~3 s on an idle core).
SYNTHETIC_CASES = [("sft", "packed", 0), ("simpo", "packed", 1), ("simpo", "rows", 2), ("bt", "packed", 1),
                   ("bt", "rows", 2)]
REAL_CASES = [("sft", "packed", 0), ("simpo", "packed", 2), ("simpo", "rows", 1), ("bt", "packed", 2),
              ("bt", "rows", 1)]


def _case_id(case):
    stage, layout, rejects = case
    return f"{stage}-{layout}" + (f"-{rejects}rej" if rejects else "")


@pytest.mark.slow
@pytest.mark.parametrize("case", SYNTHETIC_CASES, ids=_case_id)
def test_synthetic_rows_match_the_independent_stack(case, checkpoints, tmp_path):
    stage, layout, rejects = case
    path, model = checkpoints["classifier" if stage == "bt" else "causal_lm"]
    pref_rows, sft_rows, files = _synthetic_files(tmp_path, 6)
    rows = sft_rows if stage == "sft" else pref_rows
    records = list(read_records(str(files["sft" if stage == "sft" else "preference"]),
                                "sft" if stage == "sft" else "preference"))
    k = 1 + rejects
    batch_rows = k * len(rows) if layout == "rows" else len(rows)
    seq_len = SYNTHETIC_PACKED_ROW * k if layout == "packed" else SYNTHETIC_PACKED_ROW
    cfg = _config(stage, path, layout, rejects, seq_len, [f"data.batch_rows={batch_rows}"])
    got, host = ours(cfg, records)
    if layout == "packed":  # several groups share a row, so the packed path is exercised
        assert host["num_groups"].max() >= 2
    _assert_equal(got, reference(model, _hf_tokenizer(), stage, rows, rejects, seq_len))


@pytest.mark.slow
@needs_upstream_rows
@pytest.mark.parametrize("case", REAL_CASES, ids=_case_id)
def test_real_upstream_rows_match_the_independent_stack(case, checkpoints):
    """The 4 SFT rows (eval, test) or 4 SimPO rows (eval, test), each sequence cut to 160 tokens."""
    stage, layout, rejects = case
    path, model = checkpoints["classifier" if stage == "bt" else "causal_lm"]
    source = SFT_DIR if stage == "sft" else SIMPO_DIR
    rows = _read_upstream(source, ("eval", "test"))
    kind = "sft" if stage == "sft" else "preference"
    records = [r for split in ("eval", "test") for r in read_records(source, kind, split=split)]
    k = 1 + rejects
    batch_rows = k * len(rows) if layout == "rows" else len(rows)
    cfg = _config(stage, path, layout, rejects, REAL_SEQ_LEN, [f"data.batch_rows={batch_rows}"])
    got, _ = ours(cfg, records)
    _assert_equal(got, reference(model, _hf_tokenizer(), stage, rows, rejects, REAL_SEQ_LEN))


@pytest.mark.slow
def test_packed_sft_weighs_each_sample_as_upstream(checkpoints, tmp_path):
    """Packed SFT rows of [2, 1, 2] samples, one row per micro step (grad_accum 3): the loss and gradients equal
    upstream's mean over the 5 samples of each one's token mean, not the mean over rows of row means."""
    path, model = checkpoints["causal_lm"]
    _, sft_rows, files = _synthetic_files(tmp_path, 5)
    rows = sft_rows
    records = list(read_records(str(files["sft"]), "sft"))
    if os.path.isdir(SFT_DIR):  # real rows where present: samples of very different lengths
        rows = _read_upstream(SFT_DIR, ("eval", "test"))[:3] + sft_rows[:2]
        records = [r for split in ("eval", "test") for r in read_records(SFT_DIR, "sft", split=split)][:3] + \
            records[:2]
    seq_len = 96
    cfg = _config("sft", path, "packed", 0, seq_len, ["grad_accum=3", "data.batch_rows=3"])
    tok = load_tokenizer(cfg.data)
    groups = [tok.tokenize(r, truncation=TruncationConfig(max_length=seq_len)) for r in records]
    layout = [[0, 1], [2], [3, 4]]
    packed = [PackedRow([groups[i] for i in row], sum(groups[i].num_tokens for i in row)) for row in layout]
    host = rows_to_batch(packed, 2 * seq_len, 1, tok.pad_id)
    assert host["num_groups"].tolist() == [2, 1, 2]
    got = _gradients(cfg, host, max_groups=2)
    tok_hf = _hf_tokenizer()
    expected = reference(model, tok_hf, "sft", rows, 0, seq_len)
    _assert_equal(got, expected)
    # the per-row weighting the issue reported (each row a micro step of its own mean) differs
    per_sample = [reference(model, tok_hf, "sft", [r], 0, seq_len, backward=False)[0] for r in rows]
    row_means = np.mean([np.mean([per_sample[i] for i in row]) for row in layout])
    assert abs(row_means - got[0]) > 1e-3 * got[0], (row_means, got[0])
    np.testing.assert_allclose(got[0], np.mean(per_sample), rtol=TOL)


def test_reference_stack_shares_no_code():
    """The reference half of this file imports nothing from longrm_jax (it only reads the same files)."""
    source = open(__file__).read()
    reference_half = source[source.index("# The independent stack"):source.index("# Ours: the trainer's own path.")]
    assert "longrm_jax" not in reference_half and "jnp." not in reference_half
