"""Tokenization: hand-derived loss masks per format, EOS handling, truncation policies, upstream samples."""

import os

import numpy as np
import pytest

from longrm_jax.data.readers import RecordSource
from longrm_jax.data.records import DataError, PreferenceRecord, Provenance, SFTRecord
from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR, load_tiny_tokenizer
from longrm_jax.data.tokenize import (ChatTokenizer, TokenizedSample, TruncationConfig, TruncationStats,
                                      truncate_middle, truncate_sample)

from conftest import UPSTREAM_DATA as UPSTREAM
PROMPT = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the password?"})
PROV = Provenance("mem.jsonl", 3, 4)


@pytest.fixture(scope="module")
def tok():
    return ChatTokenizer(load_tiny_tokenizer())


def _enc(tok, text):
    return list(tok.encode(text))


# Hand-written expected template output (reduced Qwen3 ChatML), independent of the jinja template.
PROMPT_TEXT = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is the password?<|im_end|>\n"
               "<|im_start|>assistant\n")
THINK = "<think>\n\n</think>\n\n"


def _check(tok, sample, prompt_text, trained_text):
    ids = _enc(tok, prompt_text) + _enc(tok, trained_text)
    assert sample.input_ids.tolist() == ids
    assert sample.loss_mask.tolist() == [0] * len(_enc(tok, prompt_text)) + [1] * len(_enc(tok, trained_text))
    assert sample.input_ids.dtype == np.int32 and sample.loss_mask.dtype == np.int32
    assert sample.input_ids[-1] == tok.eos_id and sample.loss_mask[-1] == 1


def test_sft_mask_hand_derived(tok):
    rec = SFTRecord(PROMPT, "It is falcon.\n\n", PROV)
    group = tok.tokenize(rec)
    assert len(group.samples) == 1
    # enable_thinking=False: the empty think block closes the prompt; trained: answer + EOS (newlines stripped)
    _check(tok, group.samples[0], PROMPT_TEXT + THINK, "It is falcon.<|im_end|>")
    trained = group.samples[0].input_ids[group.samples[0].loss_mask == 1]
    assert tok.hf.decode(trained.tolist()) == "It is falcon.<|im_end|>"


def test_upstream_training_mask_trains_think_block(tok):
    upstream = ChatTokenizer(tok.hf, enable_thinking=None)
    group = upstream.tokenize(SFTRecord(PROMPT, "It is falcon.", PROV))
    _check(upstream, group.samples[0], PROMPT_TEXT, THINK + "It is falcon.<|im_end|>")


def test_preference_group_masks(tok):
    rec = PreferenceRecord(PROMPT, "It is falcon.", ("It is maple.", "It is river."), PROV)
    group = tok.tokenize(rec, num_rejects=2)
    assert len(group.samples) == 3
    for sample, answer in zip(group.samples, ("falcon", "maple", "river")):
        _check(tok, sample, PROMPT_TEXT + THINK, f"It is {answer}.<|im_end|>")
    # num_rejects=1 takes the first rejected only, or a seeded random one
    assert tok.tokenize(rec, num_rejects=1).samples[1].input_ids.tolist() == group.samples[1].input_ids.tolist()
    picks = {tok.hf.decode(tok.tokenize(rec, 1, reject_seed=s).samples[1].input_ids[-3:-2].tolist())
             for s in range(12)}
    assert picks == {" maple", " river"}
    with pytest.raises(DataError, match=r"mem.jsonl: line 4, field 'rejected'"):
        tok.tokenize(rec, num_rejects=3)


def _plain_tokenizer(template):
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(TINY_TOKENIZER_DIR, "tokenizer.json"),
                                 eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    hf.chat_template = template
    return ChatTokenizer(hf)


def test_eos_appended_when_template_lacks_it():
    tok = _plain_tokenizer("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                           "{% if add_generation_prompt %}assistant: {% endif %}")
    sample = tok.tokenize(SFTRecord(PROMPT, "It is falcon.", PROV)).samples[0]
    prompt_text = "system: Be brief.\nuser: What is the password?\nassistant: "
    n_prompt = len(tok.encode(prompt_text))
    resp = tok.encode("It is falcon. <|endoftext|>").tolist()  # upstream appends " " + eos_token as text
    assert resp[-1] == tok.eos_id and tok.hf.decode(resp[-2:-1]) == " "
    assert sample.input_ids.tolist() == tok.encode(prompt_text).tolist() + resp
    assert sample.loss_mask.tolist() == [0] * n_prompt + [1] * len(resp)


def test_template_without_prefix_property_errors():
    tok = _plain_tokenizer("{% if add_generation_prompt %}GEN {% endif %}"
                           "{% for m in messages %}{{ m.content }}\n{% endfor %}")
    with pytest.raises(DataError, match="mem.jsonl: line 4: the chat template"):
        tok.tokenize(SFTRecord(PROMPT, "x", PROV))


def test_right_truncation_forces_trained_eos(tok):
    stats = TruncationStats()
    full = tok.tokenize(SFTRecord(PROMPT, "It is falcon.", PROV)).samples[0]
    cut = tok.tokenize(SFTRecord(PROMPT, "It is falcon.", PROV),
                       truncation=TruncationConfig("right", max_length=len(full) - 2), stats=stats).samples[0]
    assert len(cut) == len(full) - 2 and cut.truncated
    assert cut.input_ids[:-1].tolist() == full.input_ids[:len(full) - 3].tolist()
    assert cut.input_ids[-1] == tok.eos_id and cut.loss_mask[-1] == 1
    # prompt longer than the cap: only the forced EOS is trained (as upstream)
    short = tok.tokenize(SFTRecord(PROMPT, "It is falcon.", PROV),
                         truncation=TruncationConfig("right", max_length=5), stats=stats).samples[0]
    assert short.loss_mask.tolist() == [0, 0, 0, 0, 1]
    counts = stats.as_dict()
    assert {k: counts[k] for k in ("samples", "truncated_samples", "dropped_tokens")} == {
        "samples": 2, "truncated_samples": 2, "dropped_tokens": 2 + len(full) - 5}


def test_prompt_middle_keeps_response_and_prompt_ends(tok):
    """Training's default cut: the prompt's middle goes, its first and last parts and the whole response stay."""
    stats = TruncationStats()
    full = tok.tokenize(SFTRecord(PROMPT, "It is falcon.", PROV)).samples[0]
    p, n = full.prompt_len, len(full)
    cap = n - 6
    cut = tok.tokenize(SFTRecord(PROMPT, "It is falcon.", PROV),
                       truncation=TruncationConfig("prompt_middle", max_length=cap), stats=stats).samples[0]
    keep = p - 6
    assert len(cut) == cap and cut.prompt_len == keep
    ids = full.input_ids.tolist()
    assert cut.input_ids.tolist() == ids[:keep // 2] + ids[p - (keep - keep // 2):]
    assert cut.loss_mask.tolist() == [0] * keep + [1] * (n - p)
    assert stats.as_dict()["prompt_cut_samples"] == 1 and stats.as_dict()["response_cut_samples"] == 0


def test_error_truncation_names_row(tok):
    with pytest.raises(DataError, match=r"mem.jsonl: line 4: sequence of \d+ tokens exceeds max_length 5"):
        tok.tokenize(SFTRecord(PROMPT, "It is falcon.", PROV), truncation=TruncationConfig("error", max_length=5))


def test_middle_truncation_upstream_numbers():
    ids = np.arange(140_000, dtype=np.int32)
    out = truncate_middle(ids)
    assert len(out) == 65_536 + 65_531
    assert out[:65_536].tolist() == list(range(65_536))
    assert out[65_536:].tolist() == list(range(140_000 - 65_531, 140_000))
    assert truncate_middle(ids[:131_071]).shape == (131_071,)  # below the threshold: untouched
    assert truncate_middle(ids[:131_072]).shape == (131_067,)  # at the threshold: cut
    sample = TokenizedSample(ids, (ids >= 139_000).astype(np.int32), 139_000)
    cut = truncate_sample(sample, TruncationConfig("middle", max_length=131_072), eos_id=0)
    assert cut.truncated and len(cut) == 131_067 and cut.loss_mask.sum() == 1000


def test_upstream_samples_load_and_tokenize(tok):
    for name, split, fmt, group_size in (("SFT_Data_Sampled20", "test", "sft", 1),
                                         ("SimPO_Data_Sampled20", "eval", "preference", 2)):
        src = RecordSource(os.path.join(UPSTREAM, name), split=split)
        assert src.format == fmt and len(src) == 2
        for rec in src.records():
            group = tok.tokenize(rec, num_rejects=1)
            assert len(group.samples) == group_size
            texts = [rec.response] if fmt == "sft" else [rec.chosen, rec.rejected[0]]
            for s, text in zip(group.samples, texts):
                assert s.input_ids[-1] == tok.eos_id and s.loss_mask[-1] == 1
                assert s.loss_mask[:s.prompt_len].sum() == 0 and s.loss_mask[s.prompt_len:].all()
                trained = tok.hf.decode(s.input_ids[s.loss_mask == 1].tolist())
                assert trained == text.strip() + "<|im_end|>"  # exactly the judgment, then EOS
            assert rec.provenance.source.endswith(f"{name}/{split}")


def test_prompt_ids_equal_apply_chat_template_ids(tok):
    ids = tok.hf.apply_chat_template(list(PROMPT), tokenize=True, add_generation_prompt=True, enable_thinking=False)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    sample = tok.tokenize(SFTRecord(PROMPT, "It is falcon.", PROV)).samples[0]
    assert sample.input_ids[:sample.prompt_len].tolist() == list(ids)


LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- for m in messages %}"
    "{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content | trim + '<|eot_id|>' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}")


def test_llama3_style_template_mask():
    """Llama-3.1 layout: BOS in the template, EOS <|eot_id|> ends the assistant turn, no think block."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(TINY_TOKENIZER_DIR, "tokenizer.json"))
    hf.add_special_tokens({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": "<|endoftext|>",
                           "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>"]})
    hf.chat_template = LLAMA3_TEMPLATE
    tok = ChatTokenizer(hf)  # enable_thinking is not in this template: not passed
    sample = tok.tokenize(SFTRecord(PROMPT, "It is falcon.", PROV)).samples[0]
    prompt_text = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nWhat is the password?<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n")
    _check(tok, sample, prompt_text, "It is falcon.<|eot_id|>")
    assert sample.input_ids[0] == hf.bos_token_id and (sample.input_ids == hf.bos_token_id).sum() == 1


def test_benchmark_record_masks(tok):
    """Long-RewardBench and Long-form records as preference groups: prompt untrained, each answer + EOS trained."""
    from longrm_jax.data.records import BenchRecord, LongFormRecord

    bench = BenchRecord(id="1", prompt=(PROMPT[1],), question="q", task="LongQA", subtask="", tasktype="BestOfN",
                        subtype="3", candidates=("It is falcon.", "It is maple.", "It is river."),
                        candidate_models=None, candidate_scores=None, ctx_length="4k", length=None, provenance=PROV)
    user_only = "<|im_start|>user\nWhat is the password?<|im_end|>\n<|im_start|>assistant\n" + THINK
    group = tok.tokenize(bench.to_preference(), num_rejects=2)
    for sample, answer in zip(group.samples, ("falcon", "maple", "river")):
        _check(tok, sample, user_only, f"It is {answer}.<|im_end|>")
    longform = LongFormRecord(id="2", prompt="What is the password?", chosen=("It is falcon.",),
                              rejected=("It is maple.",), subset="QA", provenance=PROV)
    group = tok.tokenize(longform.to_preference(), num_rejects=1)
    _check(tok, group.samples[0], user_only, "It is falcon.<|im_end|>")
    _check(tok, group.samples[1], user_only, "It is maple.<|im_end|>")


def test_encode_batch_equals_encode(tok):
    texts = ["the red gate is open. " * 50, "", "Answer: B\n", "ü ümlaut and 数字 123"]
    batch = tok.encode_batch(texts)
    assert len(batch) == len(texts)
    for text, ids in zip(texts, batch):
        np.testing.assert_array_equal(ids, tok.encode(text))
        assert ids.dtype == np.int32


@pytest.mark.parametrize("name", ["tiny_tokenizer", "tiny_judge_tokenizer"])
def test_bare_tokenizer_dirs_load_as_autotokenizer_does(tmp_path, name):
    """The bundled (bare) tokenizer directories skip AutoTokenizer (whose import pulls torch in): the same class,
    ids, special tokens and chat template as AutoTokenizer gives; a directory with a config.json takes
    AutoTokenizer itself."""
    import shutil

    from transformers import AutoTokenizer

    from longrm_jax.data.hf_tokenizer import load_hf_tokenizer

    path = os.path.join(os.path.dirname(TINY_TOKENIZER_DIR), name)
    want, got = AutoTokenizer.from_pretrained(path), load_hf_tokenizer(path)
    assert type(got) is type(want)
    text = "Hello <|im_start|>user\nwörld 12345<|im_end|>\n  tabs\t!"
    assert got.encode(text) == want.encode(text)
    assert (got.eos_token_id, got.pad_token_id, got.all_special_tokens) == (
        want.eos_token_id, want.pad_token_id, want.all_special_tokens)
    messages = [{"role": "user", "content": "a question"}, {"role": "assistant", "content": "an answer"}]
    assert got.apply_chat_template(messages, tokenize=False) == want.apply_chat_template(messages, tokenize=False)
    shutil.copytree(path, tmp_path / "model")
    (tmp_path / "model" / "config.json").write_text('{"model_type": "qwen3"}')
    import unittest.mock

    with unittest.mock.patch.object(AutoTokenizer, "from_pretrained", return_value="auto") as auto:
        assert load_hf_tokenizer(str(tmp_path / "model")) == "auto"
    auto.assert_called_once()
