"""Rebuild the tiny tokenizers committed in `longrm_jax/assets/` (deterministic).

`python scripts/build_tiny_tokenizer.py [--judge] [--out DIR] [--vocab-size N]`: trains a byte-level BPE on the
synthetic needle corpus (`longrm_jax.data.needles.corpus_for_tokenizer`; with `--judge` also the judge prompts,
`judge_corpus_for_tokenizer`, into `tiny_judge_tokenizer/`) and writes an HF tokenizer directory that
transformers 4.x and 5.x both read. What the tokenizers are: `longrm_jax/data/tiny_tokenizer.py`.
"""

from __future__ import annotations

import argparse
import json
import os

from longrm_jax.data.needles import corpus_for_tokenizer
from longrm_jax.data.synthetic_judge import judge_corpus_for_tokenizer
from longrm_jax.data.tiny_tokenizer import TINY_JUDGE_TOKENIZER_DIR, TINY_TOKENIZER_DIR

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")

# Reduced Qwen3 chat template (single-turn semantics identical to Qwen3 for system/user/assistant).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if loop.last %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{{- message.content | trim + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)
# The judge tokenizer's: the same, but a conversation that ends with an assistant turn ends at `<|im_end|>`, with
# no newline after it. `evaluate --is-disrm` scores a DisRM at the last token of that rendering, and training (as
# upstream) ends each answer at `<|im_end|>`: so the tiny DisRM is scored where it is trained (with Qwen3's
# newline it is scored one token later, which moves a tiny model's score; docs/upstream.md "The DisRM score
# position"). Prompts (add_generation_prompt) and training sequences are unchanged.
ASSISTANT_END = "{{- message.content | trim + '<|im_end|>\\n' }}"
JUDGE_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(
    ASSISTANT_END, "{{- message.content | trim + '<|im_end|>' }}{%- if not loop.last %}{{- '\\n' }}{%- endif %}")
assert JUDGE_CHAT_TEMPLATE != CHAT_TEMPLATE


def build_tiny_tokenizer(out_dir: str = TINY_TOKENIZER_DIR, vocab_size: int = 1024, judge: bool = False) -> str:
    """Train the tokenizer on the synthetic corpus (`judge`: plus the judge prompts) and save it as an HF
    tokenizer directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = judge_corpus_for_tokenizer() if judge else corpus_for_tokenizer()
    tok.train_from_iterator(texts, trainer=trainer)
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    _write_configs(out_dir, JUDGE_CHAT_TEMPLATE if judge else CHAT_TEMPLATE)
    return out_dir


def _write_configs(out_dir: str, chat_template: str) -> None:
    """tokenizer_config.json (with the chat template) readable by transformers 4.x and 5.x alike."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "additional_special_tokens": ["<|im_start|>", "<think>", "</think>"],
        "model_max_length": 1_048_576,
        "clean_up_tokenization_spaces": False,
        "chat_template": chat_template,
    }
    special = {k: config[k] for k in ("eos_token", "pad_token", "additional_special_tokens")}
    for name, obj in (("tokenizer_config.json", config), ("special_tokens_map.json", special)):
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Rebuild a committed tiny byte-level BPE tokenizer.")
    p.add_argument("--judge", action="store_true",
                   help="the judge tokenizer (corpus with the judge prompts; default --out: tiny_judge_tokenizer)")
    p.add_argument("--out", default=None, help="output directory (default: the committed one)")
    p.add_argument("--vocab-size", type=int, default=1024)
    args = p.parse_args(argv)
    out = args.out or (TINY_JUDGE_TOKENIZER_DIR if args.judge else TINY_TOKENIZER_DIR)
    print(build_tiny_tokenizer(out, args.vocab_size, judge=args.judge))


if __name__ == "__main__":
    main()
