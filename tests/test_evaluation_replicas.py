"""`python -m longrm_jax.evaluate --replicas N`: one process per device, each on a share of the samples, merged
into the outputs one process writes (here N CPU processes; on a GPU host one per GPU)."""

import json

import pytest
import yaml

import torch  # noqa: F401 - the test extra installs it: a broken install fails the run, never skips

from longrm_jax import evaluate  # noqa: E402
from longrm_jax.data.synthetic import write_long_rewardbench  # noqa: E402
from longrm_jax.evaluation import replicas  # noqa: E402
from helpers.tiny_checkpoint import make_tiny_model_dir  # noqa: E402


def test_share_out_balances_cost_and_keeps_order():
    costs = [9.0, 1.0, 1.0, 8.0, 1.0, 1.0, 2.0]
    shares = replicas.share_out(costs, 2)
    assert sorted(i for share in shares for i in share) == list(range(len(costs)))
    assert all(share == sorted(share) for share in shares)
    loads = [sum(costs[i] for i in share) for share in shares]
    assert max(loads) - min(loads) <= 1.0  # 12 / 11 (longest-processing-time-first)
    assert replicas.share_out(costs, 2) == shares  # a resumed run gets the same shares
    assert [len(s) for s in replicas.share_out([1.0], 3)] == [1, 0, 0]


def test_local_gpu_ids_without_starting_a_backend():
    assert replicas.local_gpu_ids({"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "0,1"}) == []
    assert replicas.local_gpu_ids({"CUDA_VISIBLE_DEVICES": "2, 3"}) == ["2", "3"]
    assert replicas.local_gpu_ids({"JAX_PLATFORMS": "cuda", "CUDA_VISIBLE_DEVICES": "-1"}) == []


def test_plan_replicas():
    from longrm_jax.models.config import from_hf_config

    config = from_hf_config({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 100, "hidden_size": 8,
                             "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                             "num_key_value_heads": 1, "head_dim": 4})
    gpus = {"CUDA_VISIBLE_DEVICES": "4,5,6"}
    assert replicas.plan_replicas("auto", None, config, "bfloat16", {"JAX_PLATFORMS": "cpu"})[0] == []
    assert replicas.plan_replicas("auto", {"fsdp": 2}, config, "bfloat16", gpus)[0] == []
    assert replicas.plan_replicas("2", None, config, "bfloat16", gpus)[0] == ["4", "5"]
    assert replicas.plan_replicas("1", None, config, "bfloat16", gpus)[0] == []
    assert replicas.plan_replicas("2", None, config, "bfloat16", {"JAX_PLATFORMS": "cpu"})[0] == ["cpu", "cpu"]
    with pytest.raises(ValueError, match="only 3 GPU"):
        replicas.plan_replicas("4", None, config, "bfloat16", gpus)


def test_a_replica_keeps_the_run_settings():
    cfg = evaluate.read_config(["--model-path", "m", "--data-path", "d", "--both-orders", "--tasks", "A", "B",
                                "--max-new-tokens", "8", "--mesh", "seq=2", "--save-path", "s", "--replicas", "2"])
    again = replicas.replica_config(cfg, "s/replicas/r0", [])
    for name in ("model_path", "data_path", "both_orders", "tasks", "max_new_tokens", "mesh"):
        assert getattr(again, name) == getattr(cfg, name), name
    assert (again.save_path, again.replicas, again.overwrite, again.resume) == ("s/replicas/r0", "1", True, False)
    assert again.only_samples == [] and again.allow_no_verdicts and not again.progress


@pytest.mark.parametrize("kind", ["grm", "disrm"])
def test_replicas_give_the_one_process_results(tmp_path, kind):
    data = tmp_path / "bench"
    write_long_rewardbench(str(data), per_task=3, seed=0, lengths=(48, 96), tasks=("LongQA", "Code"),
                           bon_fraction=0.5)
    model = tmp_path / "model"
    make_tiny_model_dir(model, "qwen3", "classifier" if kind == "disrm" else "causal_lm", layers=1, stop_every=3)
    flags = ["--model-path", str(model), "--data-path", str(data), "--dtype", "float32", "--both-orders",
             "--no-progress", "--allow-no-verdicts"]
    flags += ["--is-disrm"] if kind == "disrm" else ["--max-new-tokens", "6"]
    assert evaluate.main([*flags, "--save-path", str(tmp_path / "one"), "--replicas", "1"]) == 0
    assert evaluate.main([*flags, "--save-path", str(tmp_path / "two"), "--replicas", "2"]) == 0

    def outputs(name):
        save = tmp_path / name
        predictions = [json.loads(line) for line in (save / "predictions.jsonl").read_text().splitlines()]
        return (save / "results.csv").read_text(), predictions, json.loads((save / "results.json").read_text())

    csv_one, predictions_one, results_one = outputs("one")
    csv_two, predictions_two, results_two = outputs("two")
    assert csv_two == csv_one
    assert predictions_two == predictions_one
    assert results_two["auc"] == results_one["auc"]
    shares = [yaml.safe_load((tmp_path / "two" / "replicas" / f"r{i}" / "config.yaml").read_text())["only_samples"]
              for i in (0, 1)]
    assert shares[0] and shares[1] and not set(shares[0]) & set(shares[1])
    timings = json.loads((tmp_path / "two" / "timings.json").read_text())
    assert timings["replicas"] == 2 and len(timings["per_replica"]) == 2


def test_split_long_by_tokens_and_by_memory():
    from longrm_jax.evaluation.samples import EvalSample  # noqa: F401 - the samples below are duck-typed
    from longrm_jax.models.config import from_hf_config

    class Sample:
        def __init__(self, chars):
            self.answers = ["x" * 35, "y" * 70]
            self._chars = chars

        def prompt_messages(self):
            return [{"role": "user", "content": "c" * self._chars}]

    config = from_hf_config({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
                             "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                             "num_key_value_heads": 2, "head_dim": 16})
    short, long = Sample(350), Sample(35_000)  # ~100 and ~10,000 prompt tokens
    # GRM: 1.5 x (prompt + every answer) + the judgement budget; DisRM: 1.5 x (prompt + the longest answer)
    assert replicas.one_device_columns(short, is_disrm=False, max_new_tokens=8) == int(1.5 * 130) + 8
    assert replicas.one_device_columns(short, is_disrm=True, max_new_tokens=8) == int(1.5 * 120)
    kw = dict(is_disrm=False, max_new_tokens=8)
    assert replicas.split_long([short, long], config, "float32", **kw, device_memory=None,
                               max_tokens=1000) == [False, True]
    assert replicas.split_long([short, long], config, "float32", **kw, device_memory=None,
                               max_tokens=None) == [False, False]  # CPU replicas: memory unknown
    # a device whose memory holds the short sample's cache but not the long one's (~4 KiB per column here)
    assert replicas.split_long([short, long], config, "float32", **kw, device_memory=20 << 20,
                               max_tokens=None) == [False, True]


def test_samples_too_long_for_a_replica_run_on_a_seq_mesh(tmp_path, kind="grm"):
    """`--replica-max-tokens`: the longer samples skip the 2 replicas and are judged afterwards by the parent over
    a seq mesh of 2 (ring-attention prefill, then decode); the merged outputs are the one-process run's. (The
    judge only: the routing is the same for the DisRM, test_split_long_by_tokens_and_by_memory, and its seq-mesh
    scoring is tested with --mesh.)"""
    data = tmp_path / "bench"
    write_long_rewardbench(str(data), per_task=2, seed=1, lengths=(40, 200), tasks=("LongQA",), bon_fraction=0.5)
    model = tmp_path / "model"
    make_tiny_model_dir(model, "qwen3", "classifier" if kind == "disrm" else "causal_lm", layers=1, stop_every=3)
    flags = ["--model-path", str(model), "--data-path", str(data), "--dtype", "float32", "--no-progress",
             "--allow-no-verdicts"]
    flags += ["--is-disrm"] if kind == "disrm" else ["--max-new-tokens", "6"]
    assert evaluate.main([*flags, "--save-path", str(tmp_path / "one"), "--replicas", "1"]) == 0
    assert evaluate.main([*flags, "--save-path", str(tmp_path / "two"), "--replicas", "2",
                          "--replica-max-tokens", "300"]) == 0

    def predictions(name):
        return [json.loads(line) for line in (tmp_path / name / "predictions.jsonl").read_text().splitlines()]

    one, two = predictions("one"), predictions("two")
    timings = json.loads((tmp_path / "two" / "timings.json").read_text())
    assert 0 < timings["long_samples"] < len(one)  # some samples took each path
    shares = [yaml.safe_load(path.read_text())["only_samples"]
              for path in (tmp_path / "two" / "replicas").glob("r*/config.yaml")]
    assert sum(map(len, shares)) == len(one) - timings["long_samples"]  # the long ones went to no replica
    assert (tmp_path / "two" / "replicas" / "long" / "partial").is_dir()  # their journals, for --resume
    assert [(p["file"], p["row"]) for p in two] == [(p["file"], p["row"]) for p in one]
    for a, b in zip(one, two):
        if kind == "grm":
            assert (a.get("judgement"), a.get("verdict")) == (b.get("judgement"), b.get("verdict"))
        else:
            assert a["scores"] == pytest.approx(b["scores"], rel=1e-5, abs=1e-5)
