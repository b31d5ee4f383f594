"""The tiny byte-level BPE tokenizer committed in `longrm_jax/assets/tiny_tokenizer/`: its path and loader.

Byte-level (so any text, Chinese included, encodes), vocabulary 1024, trained on the synthetic needle corpus so
that its words are mostly single tokens. Special tokens as Qwen3: `<|endoftext|>` (pad), `<|im_start|>`,
`<|im_end|>` (EOS), `<think>`, `</think>`. The chat template is a reduced Qwen3 template: ChatML turns; the last
assistant turn opens with the empty think block; `add_generation_prompt` with `enable_thinking=False` ends the
prompt with that block (Qwen3 behaviour).

The tiny *judge* tokenizer (`longrm_jax/assets/tiny_judge_tokenizer/`) is the same kind, its corpus extended with
the generative judge's prompts (`synthetic_judge.judge_corpus_for_tokenizer`): the evaluator's 155-word judge system
prompt is 179 tokens there against 540 in the tiny tokenizer, so a tiny judge trains on 2-3x shorter sequences
(configs/tiny_grm_*.yaml, configs/tiny_disrm_bt.yaml). Its template ends a conversation that ends with an
assistant turn at `<|im_end|>` (no newline after it), the token where BT trains a DisRM's score, so that
`evaluate --is-disrm` reads the score there (docs/upstream.md "The DisRM score position").

The library only loads the committed files; `scripts/build_tiny_tokenizer.py [--judge]` rebuilds them
(deterministic).
"""

from __future__ import annotations

import os

from longrm_jax.data.hf_tokenizer import load_hf_tokenizer

TINY_TOKENIZER_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets",
                                  "tiny_tokenizer")
TINY_JUDGE_TOKENIZER_DIR = os.path.join(os.path.dirname(TINY_TOKENIZER_DIR), "tiny_judge_tokenizer")


def load_tiny_tokenizer():
    """The committed tiny tokenizer as an HF tokenizer (no network)."""
    return load_hf_tokenizer(TINY_TOKENIZER_DIR)
