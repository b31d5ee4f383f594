"""Training settings that used to be accepted or end in a raw error (issue 29 item 9), and the truncation
report (item 10): one warning per kind and one summary line with counts, instead of a line per pair."""

import logging

import pytest

from longrm_jax.data.packing import drop_untrainable
from longrm_jax.data.records import PreferenceRecord, Provenance
from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR
from longrm_jax.data.tokenize import ChatTokenizer, TruncationStats
from longrm_jax.train import main
from longrm_jax.training.config import ConfigError, load_config

TINY = ["data.batch_rows=2", "data.num_train=4", "steps=1", "eval_before=false", "eval_after=false",
        "tensorboard=false", "progress=false"]


@pytest.mark.parametrize("overrides, message", [
    (["loss.beta=-1"], "loss.beta must be > 0 (it scales the reward margin; <= 0 inverts or erases the "
                       "preference); got -1.0"),
    (["loss.beta=0"], "loss.beta must be > 0"),
    (["stage=simpo", "data.num_rejects=0"], "data.num_rejects must be >= 1 for stage simpo (each preference group "
                                            "trains its chosen response against that many rejected ones); got 0"),
    (["stage=bt", "data.num_rejects=0"], "data.num_rejects must be >= 1 for stage bt"),
    (["data.synthetic.lengths=abc"], "data.synthetic.lengths must be a list of positive token counts, e.g. "
                                     "[256, 512]; got 'abc'"),
    (["data.synthetic.lengths=[0]"], "data.synthetic.lengths must be a list of positive token counts"),
    (["data.synthetic.num_values=1"], "data.synthetic.num_values must be an integer in [1 + data.num_rejects, 16]"),
    (["data.synthetic.haystack=2"], "data.synthetic: unknown key 'haystack'; valid keys: lengths, num_distractors, "
                                    "num_values"),
])
def test_settings_that_would_train_wrongly_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config(None, overrides)
    assert str(error.value).startswith(f"config + --set: {message}")
    assert load_config(None, ["stage=sft", "data.num_rejects=0"]).data.num_rejects == 0  # sft has no rejects


def test_train_cli_one_line_for_bad_settings(capsys):
    assert main(["--set", "data.synthetic.lengths=abc"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data.synthetic.lengths" in err and "TypeError" not in err


def test_malformed_and_empty_yaml_are_one_line_naming_file_line_column(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("stage: simpo\noptim:\n  lr: [1, 2\n  b1: 0.9\n")
    assert main(["--config", str(bad)]) == 2
    assert capsys.readouterr().err == (f"error: {bad}:4:5: invalid YAML: expected ',' or ']', but got ':' "
                                       "(while parsing a flow sequence)\n")
    for text in ("", "# only a comment\n"):
        empty = tmp_path / "empty.yaml"
        empty.write_text(text)
        assert main(["--config", str(empty)]) == 2
        assert capsys.readouterr().err == (
            f"error: {empty}: the file holds no settings (empty or only comments): it would train with the "
            "built-in defaults, which are not the packaged default run. Run without --config for the packaged run, "
            "or start from a file in configs/\n")


def test_steps_zero_says_it_trains_by_epochs(tmp_path, capsys):
    from longrm_jax.train import DEFAULT_CONFIG
    from longrm_jax.training import loop

    overrides = [kv for kv in TINY if kv != "steps=1"] + ["steps=0", "epochs=1", f"output_dir={tmp_path}"]
    inputs = loop._prepare_inputs(load_config(None, overrides, base=DEFAULT_CONFIG), resume=False)
    assert inputs.total_steps == 2
    assert ("steps=0: training by epochs (1.0 x 2 batches per epoch = 2 steps); set steps=N for a fixed number of "
            "optimizer steps") in capsys.readouterr().out.splitlines()


def test_identical_pairs_give_one_warning_and_one_summary_line(caplog):
    tok = ChatTokenizer.from_dir(TINY_TOKENIZER_DIR)
    prompt = ({"role": "user", "content": "Which is better?"},)
    groups = [tok.tokenize(PreferenceRecord(prompt, "same", ("same",), Provenance("t.jsonl", i)), 1)
              for i in range(50)]
    stats = TruncationStats()
    with caplog.at_level(logging.WARNING):
        for start in range(0, 50, 10):  # five windows
            assert drop_untrainable(groups[start:start + 10], stats) == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["t.jsonl row 0: chosen and rejected are identical after tokenization and cutting; the pair "
                        "is dropped (it cannot train and would only dilute the loss); further drops are counted in "
                        "the data summary line"]
    stats.record(100, 100, 700, "t.jsonl row 0")
    line = stats.summary_line("first pass over 50 training records", "right", 64)
    assert line == ("data summary, first pass over 50 training records: 100 of 100 sequences cut to rows of 64 tokens "
                    "(data.truncation right: 0 prompts cut in the middle, 0 responses cut; 700 tokens dropped); 50 "
                    "pairs dropped as chosen == rejected after the cut (first: t.jsonl row 0). Per-sample detail: "
                    "python -m longrm_jax.data.inspect_data --data FILE --tokenizer DIR --max-length 64 "
                    "--truncation right")
    assert TruncationStats().summary_line("x", "right", 64) is None


def test_right_cut_data_reports_in_a_few_lines_without_a_false_note(tmp_path, caplog):
    """data.truncation=right at a short seq_len used to print one warning per pair (4,736 lines for the default
    run) and then say that synthetic data "has no held-out split"."""
    from longrm_jax.data.pipeline import NoTrainableDataError
    from longrm_jax.train import DEFAULT_CONFIG
    from longrm_jax.training.data_source import eval_batches, load_tokenizer, missing_eval_reason, train_iterator

    cfg = load_config(None, ["data.truncation=right", "data.seq_len=128", "data.synthetic.lengths=[400]",
                             "data.num_train=64", "data.num_eval=32", "data.batch_rows=2", "data.worker_count=1"],
                      base=DEFAULT_CONFIG)
    tok = load_tokenizer(cfg.data)
    with caplog.at_level(logging.WARNING):
        assert eval_batches(cfg, tok) == []
        iterator = train_iterator(cfg, tok)
        with pytest.raises(NoTrainableDataError):
            next(iterator)
        iterator.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("longrm")]
    assert len(warnings) <= 5, warnings
    assert not any("TruncationStats" in w for w in warnings)
    assert any(w.startswith("data summary, 32 held-out records: 64 of 64 sequences cut to rows of 128 tokens") and
               "32 pairs dropped as chosen == rejected" in w for w in warnings), warnings
    reason = missing_eval_reason(cfg)
    assert "has no held-out split" not in reason
    assert reason.startswith("no held-out pairs left: every held-out pair of synthetic was dropped (identical after "
                             "truncation to data.seq_len=128, data.truncation right; see the data summary line)")
    assert "has no held-out split" in missing_eval_reason(load_config(None, ["data.source=train.jsonl"]))


def test_num_eval_zero_says_held_out_evaluation_is_off():
    """data.num_eval=0 turns synthetic held-out pairs off: the note says so, not "raise data.seq_len"."""
    from longrm_jax.train import DEFAULT_CONFIG
    from longrm_jax.training.data_source import missing_eval_reason

    reason = missing_eval_reason(load_config(None, ["data.num_eval=0"], base=DEFAULT_CONFIG))
    assert reason == "held-out evaluation is off (data.num_eval=0)"


def test_a_run_shorter_than_a_pass_still_gets_the_summary_line(caplog):
    """The totals promised at the first cut come when the iterator closes, if the first pass never ended."""
    from longrm_jax.train import DEFAULT_CONFIG
    from longrm_jax.training.data_source import load_tokenizer, train_iterator

    cfg = load_config(None, ["data.seq_len=128", "data.synthetic.lengths=[400]", "data.num_train=512",
                             "data.batch_rows=2", "data.worker_count=1", "data.window_groups=16"], base=DEFAULT_CONFIG)
    iterator = train_iterator(cfg, load_tokenizer(cfg.data))
    with caplog.at_level(logging.WARNING):
        next(iterator)
        iterator.close()
    summaries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("data summary, ")]
    assert len(summaries) == 1 and " of 512 training records read: " in summaries[0], summaries
    assert "prompts cut in the middle" in summaries[0]
