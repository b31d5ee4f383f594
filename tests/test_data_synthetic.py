"""Synthetic needle data: deterministic, no length/style shortcut, answerable only from the context; tiny
tokenizer is committed, loads offline and scripts/build_tiny_tokenizer.py rebuilds it identically."""

import json
import os
import random
import subprocess
import sys

import pytest

from longrm_jax.data import needles, synthetic
from longrm_jax.data.readers import read_records
from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR, load_tiny_tokenizer
from longrm_jax.data.tokenize import ChatTokenizer


@pytest.fixture(scope="module")
def tok():
    return ChatTokenizer(load_tiny_tokenizer())


def test_deterministic_by_seed(tmp_path):
    a = synthetic.write_training_files(str(tmp_path / "a"), 20, 5, seed=3)
    b = synthetic.write_training_files(str(tmp_path / "b"), 20, 5, seed=3)
    c = synthetic.write_training_files(str(tmp_path / "c"), 20, 5, seed=4)
    for name in a:
        assert open(a[name]).read() == open(b[name]).read()
    assert open(a["train"]).read() != open(c["train"]).read()
    assert open(a["train"]).read() != open(a["eval"]).read()  # held-out split differs


def test_pairs_have_no_shortcut(tok):
    rows = synthetic.training_rows(40, 0, synthetic.DEFAULT_LENGTHS, num_rejects=3)
    for row in rows:
        chosen, rejects = row["chosen"], row["rejects"]
        context = row["chat_template"][1]["content"]
        assert f"is {row['answer']}." in chosen and context.count(chosen) == 1  # stated once in the context
        for r in rejects:
            assert r != chosen and r not in context
            assert len(tok.encode(r)) == len(tok.encode(chosen))  # same template and token length
            assert chosen.split()[:-1] == r.split()[:-1]  # differs only in the value
        assert 0.0 <= row["depth"] <= 1.0


def test_context_lengths_follow_targets(tok):
    rows = synthetic.training_rows(40, 1, (64, 256, 1024))
    for i, row in enumerate(rows):
        target = (64, 256, 1024)[i % 3]
        n = len(tok.encode(row["chat_template"][1]["content"]))
        assert target * 0.8 <= n <= target * 1.1 + 30, (target, n)
    depths = [r["depth"] for r in synthetic.training_rows(200, 2, (256,))]
    assert min(depths) < 0.2 and max(depths) > 0.8  # needle at all depths


def test_distractors_make_key_matter():
    rng = random.Random(0)
    s = needles.make_needle_sample(rng, 256, num_asked=1, num_distractors=3)
    assert s.context.count("The password of the") == 4
    assert needles.fact_sentence(s.keys[0], s.values[0]) in s.context


def test_sft_and_preference_files_read(tmp_path):
    paths = synthetic.write_training_files(str(tmp_path), 6, 2, seed=0, num_rejects=2)
    prefs = read_records(paths["train"])
    sfts = read_records(paths["sft_train"])
    assert len(prefs) == len(sfts) == 6
    assert all(len(p.rejected) == 2 for p in prefs)
    assert [s.response for s in sfts] == [p.chosen for p in prefs]


def test_cli_writes_everything(tmp_path):
    synthetic.main(["--out", str(tmp_path), "--num-train", "4", "--num-eval", "2", "--bench-per-task", "3"])
    assert {"train.jsonl", "eval.jsonl", "sft_train.jsonl", "sft_eval.jsonl", "long_rewardbench"} <= set(
        os.listdir(tmp_path))
    assert len(os.listdir(tmp_path / "long_rewardbench")) == 7


def test_tiny_tokenizer_committed_and_reproducible(tmp_path, tok):
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert os.path.getsize(os.path.join(TINY_TOKENIZER_DIR, name)) < 100_000
    config = json.load(open(os.path.join(TINY_TOKENIZER_DIR, "tokenizer_config.json")))
    assert "enable_thinking" in config["chat_template"] and config["eos_token"] == "<|im_end|>"
    assert 512 <= len(tok.hf) <= 2048
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>"):
        assert len(tok.encode(special)) == 1
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "build_tiny_tokenizer.py")
    subprocess.run([sys.executable, script, "--out", str(tmp_path)], check=True, capture_output=True)
    assert open(tmp_path / "tokenizer.json").read() == open(os.path.join(TINY_TOKENIZER_DIR, "tokenizer.json")).read()
