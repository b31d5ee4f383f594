"""Readers: every source kind, every format, and the bad-input errors (file, row/line, field) and skips."""

import json
import logging
import os

import pytest

from longrm_jax.data import synthetic
from longrm_jax.data.readers import RecordSource, read_long_rewardbench, read_records
from longrm_jax.data.records import (BenchRecord, DataError, LongFormRecord, PreferenceRecord, SFTRecord)

MSGS = [{"role": "system", "content": "sys"}, {"role": "user", "content": "question"}]
UPSTREAM_PREF = {"chat_template": MSGS, "chosen": "good", "rejects": ["bad1", "bad2"], "scores": 3}
GENERIC_PREF_TEXT = {"prompt": "question?", "chosen": "good", "rejected": "bad"}
GENERIC_PREF_MSGS = {"prompt": MSGS, "chosen": "good", "rejected": ["bad", "worse"]}
SFT = {"chat_template": MSGS, "golden": "[Analysis] fine [Score: 8]", "ctx_length": "32k"}
SFT_MESSAGES = {"messages": MSGS + [{"role": "assistant", "content": "answer"}]}
PAIR = {"id": 1, "prompt_template": MSGS, "question": "q", "source": "s", "task": "LongQA", "subtask": "x",
        "tasktype": "PairWise", "subtype": "same", "chosen": "A", "rejected": "B", "chosen_model": "m1",
        "rejected_model": "m2", "ctx_length_for_length": "8k", "ctx_length_for_words": "4k", "length": 8000,
        "words_count": 5000}
BON = dict(PAIR, id=2, tasktype="BestOfN", subtype="3", chosen=None, rejected=None, candidates=["a", "b", "c"],
           candidates_model=["x", "y", "z"], candidates_score=[9, 5, 1])
LONGFORM = {"id": "lf1", "prompt": "write", "chosen": ["long good"], "rejected": ["b1", "b2", "b3"],
            "subset": "Writing", "needle_position": 0.25, "length_bucket": "2K"}


def _jsonl(path, rows, raw_lines=()):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        for line in raw_lines:
            f.write(line + "\n")
    return str(path)


def test_formats_from_jsonl(tmp_path):
    recs = read_records(_jsonl(tmp_path / "p.jsonl", [UPSTREAM_PREF, GENERIC_PREF_TEXT, GENERIC_PREF_MSGS]))
    assert all(isinstance(r, PreferenceRecord) for r in recs)
    assert recs[0].rejected == ("bad1", "bad2") and recs[0].prompt == tuple(MSGS)
    assert recs[1].prompt == ({"role": "user", "content": "question?"},) and recs[1].rejected == ("bad",)
    assert recs[2].rejected == ("bad", "worse")
    assert [r.provenance.line for r in recs] == [1, 2, 3] and recs[2].provenance.row == 2
    assert recs[0].meta["scores"] == 3

    sft = read_records(_jsonl(tmp_path / "s.jsonl", [SFT, SFT_MESSAGES]))
    assert isinstance(sft[0], SFTRecord) and sft[0].response.startswith("[Analysis]")
    assert sft[1].response == "answer" and sft[1].prompt == tuple(MSGS)

    bench = read_records(_jsonl(tmp_path / "LongQA.jsonl", [PAIR, BON]))
    assert isinstance(bench[0], BenchRecord) and bench[0].is_pairwise and bench[0].candidates == ("A", "B")
    assert bench[0].candidate_models == ("m1", "m2") and bench[0].ctx_length == "8k"
    assert bench[1].candidates == ("a", "b", "c") and bench[1].candidate_scores == (9.0, 5.0, 1.0)
    assert bench[1].subtype == "3" and bench[1].id == "2"
    no_type = {k: v for k, v in PAIR.items() if k != "tasktype"}
    assert read_records(_jsonl(tmp_path / "Code.jsonl", [no_type]), "long_rewardbench")[0].is_pairwise

    lf = read_records(_jsonl(tmp_path / "lf.jsonl", [LONGFORM]))
    assert isinstance(lf[0], LongFormRecord) and lf[0].needle_position == 0.25
    pref = lf[0].to_preference()
    assert pref.chosen == "long good" and len(pref.rejected) == 3


def test_sources_json_parquet_save_to_disk(tmp_path):
    import datasets

    rows = [UPSTREAM_PREF, dict(UPSTREAM_PREF, chosen="good2")]
    json_path = tmp_path / "p.json"
    json_path.write_text(json.dumps({"data": rows}))
    assert [r.chosen for r in read_records(str(json_path))] == ["good", "good2"]
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "p.parquet"))
    assert [r.chosen for r in read_records(str(tmp_path / "p.parquet"))] == ["good", "good2"]
    ds.save_to_disk(str(tmp_path / "single"))
    assert len(read_records(str(tmp_path / "single"))) == 2
    datasets.DatasetDict({"train": ds, "eval": ds.select([1])}).save_to_disk(str(tmp_path / "dd"))
    assert [r.chosen for r in read_records(str(tmp_path / "dd"), split="eval")] == ["good2"]
    assert len(read_records(str(tmp_path / "dd"))) == 2  # default split: train
    with pytest.raises(DataError, match=r"split 'test' not found; available: \['eval', 'train'\]"):
        read_records(str(tmp_path / "dd"), split="test")


BAD_CASES = [
    ("missing field", dict(UPSTREAM_PREF, chosen=None), "preference", r"line 2, field 'chosen': missing field"),
    ("wrong type", dict(UPSTREAM_PREF, rejects=5), "preference",
     r"line 2, field 'rejects': expected a list of strings, got int"),
    ("wrong message type", dict(UPSTREAM_PREF, chat_template=[{"role": "user", "content": 3}]), "preference",
     r"line 2, field 'chat_template\[0\].content': expected a string, got int"),
    ("empty response", dict(UPSTREAM_PREF, rejects=["ok", "  \n"]), "preference",
     r"line 2, field 'rejects\[1\]': empty response"),
    ("empty golden", dict(SFT, golden=""), "sft", r"line 2, field 'golden': empty response"),
    ("unknown tasktype", dict(PAIR, tasktype="Triplet"), "long_rewardbench",
     r"line 2, field 'tasktype': unknown tasktype 'Triplet'"),
    ("null in list", dict(UPSTREAM_PREF, rejects=["ok", None]), "preference",
     r"line 2, field 'rejects\[1\]': expected a string, got NoneType"),
    ("bon scores", dict(BON, candidates_score=[1, 2]), "long_rewardbench",
     r"line 2, field 'candidates_score': expected 3 numbers"),
]


@pytest.mark.parametrize("name,bad,fmt,pattern", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_rows_named(tmp_path, name, bad, fmt, pattern, caplog):
    good = {"preference": UPSTREAM_PREF, "sft": SFT, "long_rewardbench": PAIR}[fmt]
    path = _jsonl(tmp_path / "data.jsonl", [good, bad, good])
    with pytest.raises(DataError, match=rf"data.jsonl: {pattern}"):
        read_records(path, fmt)
    with caplog.at_level(logging.WARNING):
        recs, skipped = read_records(path, fmt, skip_bad_rows=True, return_skipped=True)
    assert skipped == 1 and len(recs) == 2 and recs[1].provenance.line == 3
    assert "skipping bad row" in caplog.text and "line 2" in caplog.text


def test_invalid_json_line(tmp_path, caplog):
    path = _jsonl(tmp_path / "data.jsonl", [UPSTREAM_PREF], raw_lines=["", '{"chosen": "x",', "[1, 2]"])
    with pytest.raises(DataError, match=r"data.jsonl: line 3: invalid JSON"):
        read_records(path, "preference")
    src = RecordSource(path, "preference", skip_bad_rows=True)
    with caplog.at_level(logging.WARNING):
        assert len(list(src.records())) == 1
    assert src.skipped == 2 and "line 4: expected a JSON object" in caplog.text
    (tmp_path / "bad.json").write_text('[{"chosen": "x"},\n {oops}]')
    with pytest.raises(DataError, match=r"bad.json: line 2: invalid JSON"):
        read_records(str(tmp_path / "bad.json"))


def test_parquet_row_errors_name_row(tmp_path):
    import datasets

    datasets.Dataset.from_list([UPSTREAM_PREF, dict(UPSTREAM_PREF, chosen="")]).to_parquet(str(tmp_path / "x.parquet"))
    with pytest.raises(DataError, match=r"x.parquet: row 1, field 'chosen': empty response"):
        read_records(str(tmp_path / "x.parquet"))


def test_synthetic_bench_files_read_back(tmp_path):
    paths = synthetic.write_long_rewardbench(str(tmp_path), per_task=6, seed=1, lengths=(64, 128))
    assert set(paths) == {"LongQA", "Summ", "Safety", "ICL", "Cite", "Code", "Math"}
    data = read_long_rewardbench(str(tmp_path))
    rows = [json.loads(line) for line in open(paths["LongQA"])]
    fields = {"id", "prompt_template", "question", "source", "task", "subtask", "tasktype", "subtype", "chosen",
              "rejected", "chosen_model", "rejected_model", "candidates", "candidates_model", "candidates_score",
              "ctx_length_for_length", "ctx_length_for_words", "length", "words_count"}
    assert all(fields <= set(r) for r in rows)
    recs = data["LongQA"]
    assert {r.tasktype for r in recs} == {"PairWise", "BestOfN"}
    assert {r.subtype for r in recs if not r.is_pairwise} == {"2", "3"}  # 30% of 6 -> BoN n = 2, 3
    for r in recs:
        assert r.task == "LongQA" and len(r.candidates) == len(set(r.candidates))
        if r.candidate_scores:
            assert list(r.candidate_scores) == sorted(r.candidate_scores, reverse=True)
    assert os.path.basename(recs[0].provenance.source) == "LongQA.jsonl"


ASSISTANT = lambda text: [{"role": "assistant", "content": text}]  # noqa: E731
TRL_ROWS = [  # TRL's dataset formats (standard and conversational), each with what we read from it
    ({"prompt": "question?", "completion": "answer"}, "sft", ("question?",), "answer"),
    ({"prompt": MSGS, "completion": ASSISTANT("answer")}, "sft", ("sys", "question"), "answer"),
    ({"prompt": "question?", "chosen": "good", "rejected": "bad"}, "preference", ("question?",), ("good", ("bad",))),
    ({"prompt": MSGS, "chosen": ASSISTANT("good"), "rejected": ASSISTANT("bad")}, "preference", ("sys", "question"),
     ("good", ("bad",))),
    ({"chosen": MSGS + ASSISTANT("good"), "rejected": MSGS + ASSISTANT("bad")}, "preference", ("sys", "question"),
     ("good", ("bad",))),  # implicit prompt: the turns both share
]


@pytest.mark.parametrize("row,kind,prompt,want", TRL_ROWS, ids=["sft-text", "sft-messages", "pref-text",
                                                               "pref-messages", "pref-implicit-prompt"])
def test_trl_dataset_formats(tmp_path, row, kind, prompt, want):
    (rec,) = read_records(_jsonl(tmp_path / "trl.jsonl", [row]))  # the format detected from the fields
    assert isinstance(rec, SFTRecord if kind == "sft" else PreferenceRecord)
    assert tuple(m["content"] for m in rec.prompt) == prompt
    assert (rec.response if kind == "sft" else (rec.chosen, rec.rejected)) == want


TRL_BAD = [
    ({"prompt": MSGS, "chosen": ASSISTANT("good") * 2, "rejected": ASSISTANT("bad")},
     r"field 'chosen': expected one assistant message, got 2 messages"),
    ({"prompt": MSGS, "chosen": [{"role": "user", "content": "x"}], "rejected": ASSISTANT("bad")},
     r"field 'chosen\[0\].role': expected 'assistant', got 'user'"),
    ({"chosen": MSGS + ASSISTANT("good"), "rejected": MSGS[1:] + ASSISTANT("bad")},
     r"field 'rejected': without a 'prompt' field, chosen and rejected must share every turn but their last"),
    ({"chosen": ASSISTANT("good"), "rejected": ASSISTANT("bad")}, r"field 'chosen': missing prompt"),
    ({"prompt": "q", "completion": ASSISTANT("")}, r"field 'completion\[0\].content': empty response"),
]


@pytest.mark.parametrize("row,pattern", TRL_BAD, ids=["two-messages", "not-assistant", "prompts-differ",
                                                      "no-prompt", "empty-completion"])
def test_trl_dataset_format_errors_name_the_field(tmp_path, row, pattern):
    with pytest.raises(DataError, match=rf"trl.jsonl: line 1, {pattern}"):
        read_records(_jsonl(tmp_path / "trl.jsonl", [row]))
