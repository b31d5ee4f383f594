"""The tiny byte-level BPE tokenizer committed in `longrm_jax/assets/tiny_tokenizer/`, and how to rebuild it.

Byte-level (so any text, Chinese included, encodes), vocabulary 1024, trained on the synthetic needle corpus so
that its words are mostly single tokens. Special tokens as Qwen3: `<|endoftext|>` (pad), `<|im_start|>`,
`<|im_end|>` (EOS), `<think>`, `</think>`. The chat template is a reduced Qwen3 template: ChatML turns; the last
assistant turn opens with the empty think block; `add_generation_prompt` with `enable_thinking=False` ends the
prompt with that block (Qwen3 behaviour).

Rebuild: `python -m longrm_jax.data.tiny_tokenizer [--out DIR]` (deterministic).
"""

from __future__ import annotations

import argparse
import json
import os

TINY_TOKENIZER_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets",
                                  "tiny_tokenizer")

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


def build_tiny_tokenizer(out_dir: str = TINY_TOKENIZER_DIR, vocab_size: int = 1024) -> str:
    """Train the tokenizer on the synthetic corpus and save it as an HF tokenizer directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from longrm_jax.data.synthetic import corpus_for_tokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = corpus_for_tokenizer()
    tok.train_from_iterator(texts, trainer=trainer)
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    _write_configs(out_dir)
    return out_dir


def _write_configs(out_dir: str) -> None:
    """tokenizer_config.json (with the chat template) readable by transformers 4.x and 5.x alike."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "additional_special_tokens": ["<|im_start|>", "<think>", "</think>"],
        "model_max_length": 1_048_576,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    special = {k: config[k] for k in ("eos_token", "pad_token", "additional_special_tokens")}
    for name, obj in (("tokenizer_config.json", config), ("special_tokens_map.json", special)):
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")


def load_tiny_tokenizer():
    """The committed tiny tokenizer as an HF tokenizer (no network)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m longrm_jax.data.tiny_tokenizer",
                                description="Rebuild the committed tiny byte-level BPE tokenizer.")
    p.add_argument("--out", default=TINY_TOKENIZER_DIR)
    p.add_argument("--vocab-size", type=int, default=1024)
    args = p.parse_args(argv)
    print(build_tiny_tokenizer(args.out, args.vocab_size))


if __name__ == "__main__":
    main()
