"""A local tokenizer directory as transformers loads it, without the Hub and without importing torch where that
can be avoided; and chat-template files."""

from __future__ import annotations

import json
import os

# Files of which a tokenizer directory holds at least one (transformers reads the rest from them).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


# Tokenizer classes that AutoTokenizer loads as named when a directory holds only a tokenizer (no config.json,
# so no model type can override the class): the generic fast tokenizer (transformers 5 aliases it).
GENERIC_TOKENIZER_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


def load_hf_tokenizer(path: str):
    """transformers' tokenizer of the local directory ``path``, as ``AutoTokenizer.from_pretrained`` loads it.

    A bare tokenizer directory (no config.json) whose tokenizer_config.json names the generic fast class is loaded
    through that class directly: AutoTokenizer then resolves to the same class, but its module imports
    transformers' model-configuration code and with it torch, 2.5 of the 3.4 s a CLI spent loading the bundled
    tiny tokenizer on a CPU. Any other directory goes through AutoTokenizer (model types override classes there)."""
    config_path = os.path.join(path, "tokenizer_config.json")
    if not os.path.isfile(os.path.join(path, "config.json")) and os.path.isfile(config_path):
        with open(config_path) as f:
            name = json.load(f).get("tokenizer_class")
        if name in GENERIC_TOKENIZER_CLASSES:
            from transformers import PreTrainedTokenizerFast  # heavy: imported only to load one

            return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    from transformers import AutoTokenizer  # heavy: imported only to load one

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def read_chat_template(path: str) -> str:
    """The text of a Jinja chat-template file (a clear error if it is missing or empty)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise FileNotFoundError(f"chat template file {path}: {e.strerror}") from None
    if not text.strip():
        raise ValueError(f"chat template file {path} is empty")
    return text
