"""The whole-run GRM queue (evaluation.grm.queue) against task-by-task judging, through the CLI: same
results.csv, predictions and per-task files, token for token, with --both-orders and with --resume after a
run killed mid-queue; and the slot plan and run estimate (evaluation.grm.slot_plan / estimate) for 8B shapes
against an H100's and an H200's memory, without a device."""

import json
import logging

import pytest

pytest.importorskip("torch")

from longrm_jax import evaluate  # noqa: E402
from longrm_jax.data.synthetic import write_long_rewardbench  # noqa: E402
from longrm_jax.evaluation.grm import queue as grm_queue  # noqa: E402
from longrm_jax.evaluation.grm.generation import GreedyGenerator  # noqa: E402
from longrm_jax.evaluation.grm.slot_plan import plan_pools, plan_slots  # noqa: E402
from helpers.tiny_checkpoint import make_tiny_model_dir  # noqa: E402

VOCAB = 650
TASKS = ("LongQA", "Code", "Math")


@pytest.fixture(scope="module")
def grm_and_bench(tmp_path_factory):
    root = tmp_path_factory.mktemp("queue")
    model = root / "grm"
    # A third of the vocabulary stops a judgement: rows end at different steps, so slots refill mid-pool.
    make_tiny_model_dir(model, "qwen3", vocab_size=VOCAB, layers=1, stop_every=3)
    data = root / "bench"
    write_long_rewardbench(str(data), per_task=3, seed=0, lengths=(48,), tasks=TASKS, bon_fraction=0.5)
    return model, data


def _run(model, data, save, *flags):
    return evaluate.main(["--model-path", str(model), "--data-path", str(data), "--save-path", str(save),
                          "--dtype", "float32", "--max-new-tokens", "10", "--no-progress", "--both-orders",
                          "--batch-size", "16", "--decode-chunk", "3",
                          "--allow-no-verdicts", *flags])  # random weights: outputs compared, not verdicts


def _outputs(save):
    return {name: (save / name).read_text() for name in
            ("results.csv", "predictions.jsonl", *(f"{task}.jsonl" for task in TASKS))}


@pytest.mark.slow
def test_whole_run_queue_equals_task_by_task_and_resumes_after_a_kill(grm_and_bench, tmp_path, monkeypatch,
                                                                       caplog):
    model, data = grm_and_bench
    generated = []  # prompts per generator call
    real_generate = GreedyGenerator.generate

    def counting_generate(self, prompts, *args, **kwargs):
        generated.append(len(prompts))
        return real_generate(self, prompts, *args, **kwargs)

    monkeypatch.setattr(GreedyGenerator, "generate", counting_generate)
    with caplog.at_level(logging.INFO):
        assert _run(model, data, tmp_path / "per_task", "--queue", "per-task") == 0
    assert caplog.text.count("7 prompts on   8 slots") == len(TASKS)  # a file's prompts: half the slots
    caplog.clear()
    assert len(generated) == len(TASKS)
    total_prompts = sum(generated)
    reference = _outputs(tmp_path / "per_task")
    counts = {p["generated_tokens"] for p in map(json.loads, reference["predictions.jsonl"].splitlines())}
    assert len(counts) >= 3, counts  # judgements stopped at different steps

    generated.clear()
    with caplog.at_level(logging.INFO):
        assert _run(model, data, tmp_path / "run") == 0
    assert generated == [total_prompts]  # one queue for the whole run
    assert _outputs(tmp_path / "run") == reference
    assert not list((tmp_path / "run" / "partial").glob("*.journal.jsonl"))  # journals removed once saved
    assert "21 prompts on  16 slots" in caplog.text and "no prefill/decode rate known for this device" in caplog.text

    # A run killed after 7 samples are judged (an exception where the journal writes), then resumed.
    killed = tmp_path / "killed"
    real_append = grm_queue.TaskJournal.append
    journaled = []

    def dying_append(self, index, prediction):
        if len(journaled) == 7:
            raise RuntimeError("killed")
        journaled.append(prediction["id"])
        real_append(self, index, prediction)

    monkeypatch.setattr(grm_queue.TaskJournal, "append", dying_append)
    generated.clear()
    assert _run(model, data, killed) == 1
    # Judged samples are in the journals of unfinished files, or in partial/{Task}.jsonl of finished ones.
    journals = list((killed / "partial").glob("*.journal.jsonl"))
    finished = [p for p in (killed / "partial").glob("*.jsonl") if p not in journals]
    assert journals and sum(len(p.read_text().splitlines()) - 1 for p in journals + finished) == 7
    # The kill can cut the last line short: that line is dropped on resume, and its sample judged again.
    cut = max(journals, key=lambda j: len(j.read_text().splitlines()))
    text = cut.read_text()
    cut.write_text(text[: len(text) - 20])
    reused = [json.loads(line)["id"] for p in finished for line in p.read_text().splitlines()[1:]]
    for journal in journals:
        for line in journal.read_text().splitlines()[1:]:
            try:
                reused.append(json.loads(line)["prediction"]["id"])
            except json.JSONDecodeError:
                pass
    assert len(reused) == 6
    monkeypatch.setattr(grm_queue.TaskJournal, "append", real_append)

    generated.clear()
    assert _run(model, data, killed, "--resume") == 0
    assert _outputs(killed) == reference
    judgements = {p["id"]: len(p.get("orders", [p])) for p in map(json.loads,
                                                                   reference["predictions.jsonl"].splitlines())}
    assert generated == [total_prompts - sum(judgements[i] for i in reused)]  # only the samples not journaled
    assert not list((killed / "partial").glob("*.journal.jsonl"))

    # Everything saved: a resume loads no model and writes the same files.
    def no_model(*_, **__):
        raise AssertionError("the model must not be loaded when every task file is reused")

    from longrm_jax.evaluation import runner

    monkeypatch.setattr(runner, "load_model", no_model)
    assert _run(model, data, killed, "--resume") == 0
    assert _outputs(killed) == reference


QWEN3_8B = dict(family="qwen3", qk_norm=True, vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128, dtype="bfloat16", param_dtype="bfloat16")
QWEN3_8B_WEIGHT_BYTES = 2 * 8_190_735_360  # bf16, untied LM head (Qwen3-8B's parameter count)


@pytest.mark.parametrize("device, memory_gib, short_slots", [("H100 80GB", 79.2, 16), ("H200 141GB", 139.8, 16)])
def test_slot_plan_of_an_8b_judge_on_real_device_memory(device, memory_gib, short_slots):
    """Qwen3-8B (144 KiB of KV cache per token) with 2,048 new tokens: the short buckets get at least 16 slots on
    an H100's and an H200's memory, whether the device reports all of it or JAX's default 75% preallocation;
    slots shrink with the bucket; a bucket of a run holds as many slots as memory allows once it has the
    prompts (not one, as per-task queues of a 35-sample slice had)."""
    from longrm_jax.models import ModelConfig

    config = ModelConfig(**QWEN3_8B)
    assert 2 * config.num_layers * config.num_kv_heads * config.head_dim * 2 == 144 * 1024
    for fraction in (1.0, 0.75):
        memory = int(fraction * memory_gib * (1 << 30))
        slots = {bucket: plan_slots(config, QWEN3_8B_WEIGHT_BYTES, bucket + 2048, memory)["slots"]
                 for bucket in (4096, 8192, 16384, 32768, 65536)}
        assert slots[4096] >= short_slots and slots[8192] >= short_slots, (device, fraction, slots)
        assert list(slots.values()) == sorted(slots.values(), reverse=True)
        # 270 prompts per bucket (a task's share of Long-RewardBench): the pool takes what memory allows.
        lengths = [4000] * 270 + [8000] * 270
        pools = plan_pools(lengths, 2048, lambda columns: (
            plan_slots(config, QWEN3_8B_WEIGHT_BYTES, columns, memory)["slots"], ""))
        assert [p.slots for p in pools] == [slots[8192], slots[4096]]
    # 128K contexts on an H200: a few slots (the issue's ~5), never zero.
    at_128k = plan_slots(config, QWEN3_8B_WEIGHT_BYTES, 131072 + 2048, int(139.8 * (1 << 30)))
    assert at_128k["fits"] and 1 <= at_128k["slots"] <= 5


def test_run_estimate_says_minutes_or_that_no_rate_is_known():
    from longrm_jax.evaluation.grm.estimate import estimate_run
    from longrm_jax.models import ModelConfig

    config = ModelConfig(**QWEN3_8B)
    lengths = [30000] * 16 + [4000] * 64
    budgets = [2048] * len(lengths)

    def slots_for(columns):
        return plan_slots(config, QWEN3_8B_WEIGHT_BYTES, columns, int(139.8 * (1 << 30)))["slots"], ""

    pools = plan_pools(lengths, 2048, slots_for)
    h200 = estimate_run(config, QWEN3_8B_WEIGHT_BYTES, pools, lengths, budgets, "NVIDIA H200")
    h100 = estimate_run(config, QWEN3_8B_WEIGHT_BYTES, pools, lengths, budgets, "NVIDIA H100 80GB HBM3")
    cpu = estimate_run(config, QWEN3_8B_WEIGHT_BYTES, pools, lengths, budgets, "cpu")
    assert "minutes on this device (NVIDIA H200)" in h200.message()
    assert "measured on an H100" in h100.message() and h100.total_s > h200.total_s
    assert "no prefill/decode rate known" in cpu.message()
    assert sum(h200.prompt_seconds) == pytest.approx(h200.prefill_s + h200.decode_s)
    # A 30K prompt (bucket 32K) prefills at about the measured 26,155 tokens/s of a 32K prompt.
    long_only = estimate_run(config, QWEN3_8B_WEIGHT_BYTES, pools[:1], lengths, budgets, "NVIDIA H200")
    assert pools[0].bucket == 32768 and long_only.prefill_s / 16 == pytest.approx(32768 / 26155, rel=0.05)
    # Batch-1 decode at ~32K: at most the measured 172.7 tokens/s (72% of the bound; the rule's 57% comes from
    # whole-benchmark runs, where per-step costs of mixed pools weigh more), and not far below it.
    one = plan_pools([30000], 2048, lambda columns: (1, ""))
    single = estimate_run(config, QWEN3_8B_WEIGHT_BYTES, one, [30000], [2048], "NVIDIA H200")
    assert 0.7 * 172.7 <= 2048 / single.decode_s <= 172.7


def test_pool_steps_follow_the_continuous_schedule():
    """A pool decodes for its schedule's length: each prompt takes the slot that frees first; a pool that
    drains (one long judgement left) runs its steps with fewer rows, and the estimate prices those steps."""
    from longrm_jax.evaluation.grm.estimate import estimate_run, pool_steps
    from longrm_jax.evaluation.grm.slot_plan import Pool
    from longrm_jax.models import ModelConfig

    assert pool_steps([100] * 8, 8) == 100 and pool_steps([100] * 8, 4) == 200 and pool_steps([100] * 3, 8) == 100
    assert pool_steps([2048, 10, 10, 10], 2) == 2048 and pool_steps([10, 10, 10, 2048], 2) == 2058
    config = ModelConfig(**QWEN3_8B)
    lengths = [8000] * 8
    drained = estimate_run(config, QWEN3_8B_WEIGHT_BYTES, [Pool(8192, list(range(8)), 8, 8, "")], lengths,
                           [2048] + [16] * 7, "NVIDIA H200")
    full = estimate_run(config, QWEN3_8B_WEIGHT_BYTES, [Pool(8192, list(range(8)), 8, 8, "")], lengths,
                        [2048] * 8, "NVIDIA H200")
    # 2,048 steps either way, each reading the weights (16 GB) and the active rows' caches (up to 9 GB): the
    # drained pool's 2,160 tokens cost 65% of what the full pool's 16,384 do (a per-token share: 13%).
    assert full.decode_s > drained.decode_s > 0.6 * full.decode_s
    assert sum(drained.prompt_seconds) == pytest.approx(drained.prefill_s + drained.decode_s)
