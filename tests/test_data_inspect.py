"""The inspect CLI: counts, histogram, truncation and packing summary, rendered mask; errors name the row."""

import json

import pytest

from longrm_jax.data import synthetic
from longrm_jax.data.inspect_data import length_histogram, main
from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR


def test_inspect_preference_file(tmp_path, capsys):
    paths = synthetic.write_training_files(str(tmp_path), 12, 2, seed=0, lengths=(48, 96))
    assert main(["--data", paths["train"], "--tokenizer", TINY_TOKENIZER_DIR, "--max-length", "256"]) == 0
    out = capsys.readouterr().out
    assert "format: preference  rows: 12" in out and "groups: 12  samples: 24" in out
    assert "histogram" in out and "packing into buckets" in out and "rules at row length 256" in out
    # 6 pairs are longer than 256 tokens in total (each sample fits): rows of their own, nothing cut
    assert "groups in a row of their own: 6  identical pairs dropped: 0" in out
    assert "prompt cut in its middle: 0  response cut: 0" in out
    # rendered sample: prompt bracketed (untrained); as upstream training, the empty think block opens the
    # trained response; the answer and EOS plain (trained)
    assert "[[<|im_start|>system" in out and "<|im_start|>assistant\n]]<think>\n\n</think>\n\nThe password" in out
    assert out.rstrip().endswith("<|im_end|>")


def test_inspect_counts_prompt_cuts_and_think_option(tmp_path, capsys):
    paths = synthetic.write_training_files(str(tmp_path), 6, 2, seed=0, lengths=(160,))
    assert main(["--data", paths["train"], "--tokenizer", TINY_TOKENIZER_DIR, "--max-length", "128",
                 "--enable-thinking", "false"]) == 0
    out = capsys.readouterr().out
    assert "prompt cut in its middle: 12  response cut: 0" in out  # every sample: prompt cut, response whole
    assert "groups in a row of their own: 6" in out
    assert "</think>\n\n]]The password" in out  # enable_thinking false: the block ends the masked prompt


def test_inspect_bench_and_sft(tmp_path, capsys):
    synthetic.write_long_rewardbench(str(tmp_path), per_task=3, seed=0, lengths=(48,), tasks=("Math",))
    assert main(["--data", str(tmp_path / "Math.jsonl"), "--tokenizer", TINY_TOKENIZER_DIR]) == 0
    assert "format: long_rewardbench" in capsys.readouterr().out
    paths = synthetic.write_training_files(str(tmp_path / "t"), 3, 1, seed=0, lengths=(48,))
    assert main(["--data", paths["sft_train"], "--tokenizer", TINY_TOKENIZER_DIR, "--sample", "2"]) == 0
    assert "--- sft:" in capsys.readouterr().out


def test_inspect_bad_row(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "q", "chosen": "a", "rejected": 3}) + "\n")
    assert main(["--data", str(path), "--tokenizer", TINY_TOKENIZER_DIR, "--format", "preference"]) == 2
    assert "bad.jsonl: line 1, field 'rejected'" in capsys.readouterr().err
    assert main(["--data", str(path), "--tokenizer", TINY_TOKENIZER_DIR, "--format", "preference",
                 "--skip-bad-rows"]) == 0
    assert "bad rows skipped: 1" in capsys.readouterr().out


def test_help_and_histogram(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "loss mask" in capsys.readouterr().out
    text = length_histogram([3, 100, 120, 1000])
    assert "65-128" in text and "max 1000" in text
