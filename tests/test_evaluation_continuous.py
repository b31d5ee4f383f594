"""Continuous batching (slot refilling) for GRM greedy generation vs transformers ``generate`` (fp32, tiny
random Qwen3), and the memory-based slot count."""

import numpy as np
import pytest

import torch  # the test extra installs it: a broken install fails the run, never skips

from longrm_jax import load_pretrained  # noqa: E402
from longrm_jax.evaluation.grm.continuous import memory_plan, memory_slots  # noqa: E402
from longrm_jax.evaluation.grm.generation import GreedyGenerator  # noqa: E402
from helpers.tiny_checkpoint import make_tiny_model_dir  # noqa: E402

VOCAB = 650
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def causal_lm(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "qwen3_grm"
    return path, make_tiny_model_dir(path, "qwen3", vocab_size=VOCAB)


def _hf_greedy(ref, prompt):
    with torch.no_grad():
        out = ref.generate(torch.tensor(prompt[None].astype(np.int64)), max_new_tokens=NEW_TOKENS, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].numpy()


@pytest.mark.slow
def test_continuous_matches_generate_with_refills(causal_lm):
    """9 prompts of mixed lengths (two buckets) on 3 slots; stop ids picked from the reference continuations
    so that rows stop at different steps (one at its very first token) while others run to the budget."""
    path, ref = causal_lm
    model = load_pretrained(path, dtype="float32")
    rng = np.random.default_rng(3)
    prompts = [rng.integers(5, VOCAB, n).astype(np.int32) for n in (41, 9, 100, 17, 150, 3, 64, 130, 25)]
    references = [_hf_greedy(ref, p) for p in prompts]
    stops = {int(references[0][5]), int(references[3][0]), int(references[4][11])}
    expected = []
    for theirs in references:
        cut = [i for i, t in enumerate(theirs.tolist()) if t in stops]
        expected.append((theirs[: cut[0]] if cut else theirs, bool(cut)))
    lengths = {len(e[0]) for e in expected}
    assert 0 in lengths and NEW_TOKENS in lengths and len(lengths) >= 3  # the mix the test is about

    for chunk in (3,):  # 3 steps per call: refills land mid-chunk and at chunk ends
        generator = GreedyGenerator(model, pad_id=0, stop_ids=sorted(stops), max_new_tokens=NEW_TOKENS,
                                    letter_ids=[37, 38], batch_size=3, continuous=True, decode_chunk=chunk)
        outs = generator.generate(prompts, progress=False)
        for index, (out, (tokens, stopped)) in enumerate(zip(outs, expected)):
            np.testing.assert_array_equal(out.tokens, tokens, err_msg=f"prompt {index}, chunk {chunk}")
            assert out.stopped == stopped
            assert out.letter_logprobs.shape == (len(tokens), 2)

    # Per-prompt budgets (the benchmark's simulated judgement lengths): each continuation cut at its budget.
    budgets = [1 + (7 * i) % NEW_TOKENS for i in range(len(prompts))]
    cut = generator.generate(prompts, progress=False, budgets=budgets)  # same shapes: no recompile
    for out, (tokens, _), budget in zip(cut, expected, budgets):
        np.testing.assert_array_equal(out.tokens, tokens[:budget])
    assert generator.timings["decode_tokens"] > 0 and generator.timings["prefill_tokens"] == sum(map(len, prompts))

    # 3 prompts of one bucket, 8 slots allowed: 4 slots (a power of two), one never filled.
    few = GreedyGenerator(model, pad_id=0, stop_ids=sorted(stops), max_new_tokens=NEW_TOKENS, letter_ids=[37, 38],
                          batch_size=8, continuous=True, decode_chunk=3).generate(prompts[:2] + prompts[3:4],
                                                                                  progress=False)
    for out, (tokens, _) in zip(few, expected[:2] + expected[3:4]):
        np.testing.assert_array_equal(out.tokens, tokens)

    static = GreedyGenerator(model, pad_id=0, stop_ids=sorted(stops), max_new_tokens=NEW_TOKENS,
                             letter_ids=[37, 38], batch_size=4).generate(prompts, progress=False)
    for ours, theirs in zip(outs, static):  # letter log-probs agree with the static path's
        np.testing.assert_allclose(ours.letter_logprobs, theirs.letter_logprobs, rtol=1e-4, atol=1e-5)


def test_slots_fit_next_to_the_weights(causal_lm):
    path, _ = causal_lm
    model = load_pretrained(path, dtype="float32")
    plan = memory_plan(model, 1000, 1 << 30)
    assert plan["fits"] and plan["slots"] > 1
    more = memory_plan(model, 1000, 2 << 30)
    assert more["slots"] >= plan["slots"]
    assert memory_plan(model, 1000, plan["weights"])["slots"] == 1  # nothing left: one slot, flagged
    assert not memory_plan(model, 1000, plan["weights"])["fits"]
    assert memory_slots(model, 1000, memory_bytes=1 << 30)[0] == plan["slots"]


@pytest.mark.slow
def test_evaluate_results_equal_batch_one_run(tmp_path):
    """``python -m longrm_jax.evaluate`` with continuous batching (3 slots, 2 steps per call) writes the
    results.csv and judgements of a static batch-1 run. A third of the vocabulary is made a stop id
    (generation_config.json) so that judgements end at different steps."""
    import csv
    import json

    from longrm_jax import evaluate
    from longrm_jax.data.synthetic import write_long_rewardbench

    model = tmp_path / "grm"
    make_tiny_model_dir(model, "qwen3", vocab_size=VOCAB, layers=1, stop_every=3)
    data = tmp_path / "bench"
    write_long_rewardbench(str(data), per_task=4, seed=0, lengths=(48, 96), tasks=("LongQA", "Code"),
                           bon_fraction=0.5)
    runs = {"batch1": ["--static-batches", "--batch-size", "1"],
            "continuous": ["--batch-size", "3", "--decode-chunk", "2"]}
    outputs = {}
    for name, flags in runs.items():
        save = tmp_path / name
        assert evaluate.main(["--model-path", str(model), "--data-path", str(data), "--save-path", str(save),
                              "--dtype", "float32", "--max-new-tokens", "12", "--no-progress",
                              "--allow-no-verdicts", *flags]) == 0  # random weights: outputs compared
        with open(save / "results.csv") as handle:
            rows = list(csv.reader(handle))
        judged = [{k: p[k] for k in ("id", "output", "generated_tokens", "stopped", "answer_scores")}
                  for p in map(json.loads, (save / "predictions.jsonl").read_text().splitlines())]
        outputs[name] = rows, judged
    assert outputs["continuous"] == outputs["batch1"]
    counts = {j["generated_tokens"] for j in outputs["batch1"][1]}
    assert len(counts) >= 3, counts  # rows stopped at different steps


def test_evaluate_help_documents_batching_flags(capsys):
    from longrm_jax import evaluate

    with pytest.raises(SystemExit):
        evaluate.main(["--help"])
    text = capsys.readouterr().out
    for flag in ("--static-batches", "--decode-chunk", "--device-memory-gib", "--simulate-judgement-lengths"):
        assert flag in text


def test_donated_slot_state_and_cache_have_one_buffer_per_leaf():
    """admit/decode donate the cache and the slot state; a GPU refuses a buffer donated twice (the CPU backend
    never donates, so check the buffers themselves)."""
    import jax

    from longrm_jax.evaluation.grm.continuous import empty_state

    leaves = jax.tree.leaves(empty_state(4, 8, 3, 0))
    pointers = [x.unsafe_buffer_pointer() for x in leaves]
    assert len(set(pointers)) == len(pointers)


def test_previous_pool_cache_released_before_next_pool(causal_lm, monkeypatch):
    """Each pool is planned to fill the device by itself, so the last pool's slot cache must be gone before the
    next is allocated (holding both ran an H100 out of memory). Live device bytes at each ``init_cache`` call:
    the second pool's allocation sees no first-pool cache."""
    import jax

    path, _ = causal_lm
    model = load_pretrained(path, dtype="float32")
    seen = []
    original = type(model).init_cache

    def spy(self, slots, columns, *args, **kwargs):
        live = sum(a.nbytes for a in jax.live_arrays() if a.ndim == 5)  # [layers, slots, columns, kv, head]
        cache = original(self, slots, columns, *args, **kwargs)
        if slots > 1:  # the pools' slot caches (a prompt's prefill cache has one row)
            seen.append((live, cache.k.nbytes + cache.v.nbytes))
        return cache

    monkeypatch.setattr(type(model), "init_cache", spy)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(5, VOCAB, n).astype(np.int32) for n in (150, 140, 20, 12)]  # two buckets
    GreedyGenerator(model, pad_id=0, stop_ids=[], max_new_tokens=4, letter_ids=[37, 38], batch_size=2,
                    continuous=True, decode_chunk=2).generate(prompts, progress=False)
    assert len(seen) == 2
    assert seen[1][0] < seen[0][1], f"the first pool's cache ({seen[0][1]} bytes) was live: {seen}"


class _ArrivingPrompts:
    """A live source (evaluation.grm.continuous.LiveSource) whose second prompt arrives only after the first has
    been asked for new work a few times, i.e. while the first one decodes."""

    def __init__(self, arrives_at_ask: int = 0):
        self.waiting, self.later, self.arrives_at_ask = [], None, arrives_at_ask
        self.asks, self.delivered, self.stopping = 0, [], False

    def next_length(self, timeout):
        return len(self.waiting[0].prompt) if self.waiting else None

    def take(self, limit, bucket):
        self.asks += 1
        if self.asks == self.arrives_at_ask:
            self.waiting.append(self.later)
        taken = [item for item in self.waiting[:limit] if len(item.prompt) <= bucket]
        self.waiting = self.waiting[len(taken):]
        return taken

    def item(self, name, prompt, budget):
        from longrm_jax.evaluation.grm.continuous import LiveItem

        def deliver(result):
            self.delivered.append((name, result))
            self.stopping = len(self.delivered) == 2

        return LiveItem(prompt, budget, deliver)


def _live_generator(causal_lm, slots: int, seed: int, lengths):
    """(a continuous generator of ``slots`` slots, 2 decode steps per round trip, on the tiny model; random
    prompts of ``lengths`` tokens)."""
    path, _ = causal_lm
    rng = np.random.default_rng(seed)
    generator = GreedyGenerator(load_pretrained(path, dtype="float32"), pad_id=0, stop_ids=[],
                                max_new_tokens=NEW_TOKENS, letter_ids=[37, 38], batch_size=slots, continuous=True,
                                decode_chunk=2)
    return generator, [rng.integers(5, VOCAB, n).astype(np.int32) for n in lengths]


def test_a_prompt_that_arrives_mid_decode_joins_the_running_pool(causal_lm):
    """A server's live pool (GreedyGenerator.generate_live): a short judgement that arrives while a long one
    decodes is admitted into the free slot at the next host round trip and delivered first, and both
    generations equal what the evaluator's continuous batching gives the same prompts and budgets."""
    generator, (long_prompt, short_prompt) = _live_generator(causal_lm, 2, 5, (40, 12))
    source = _ArrivingPrompts(arrives_at_ask=3)
    source.waiting = [source.item("long", long_prompt, NEW_TOKENS)]
    source.later = source.item("short", short_prompt, 3)
    pools = []
    generator.generate_live(source, max_length=64, on_pool=pools.append)
    assert [name for name, _ in source.delivered] == ["short", "long"]  # the short one did not wait for the long
    assert len(pools) == 1 and pools[0].get("decode_calls") < NEW_TOKENS // 2 + 3
    want = generator.generate([long_prompt, short_prompt], progress=False, budgets=[NEW_TOKENS, 3])
    got = dict(source.delivered)
    for name, expected in (("long", want[0]), ("short", want[1])):
        np.testing.assert_array_equal(got[name].tokens, expected.tokens, err_msg=name)
        np.testing.assert_allclose(got[name].letter_logprobs, expected.letter_logprobs, rtol=1e-6, err_msg=name)
    assert len(got["short"].tokens) == 3 and len(got["long"].tokens) == NEW_TOKENS


def test_a_prompt_nobody_waits_for_gives_its_slot_up(causal_lm):
    """One slot, two prompts: the first one's request goes away while it decodes (``LiveItem.abandoned``); its
    slot goes to the second at the next round trip, which is delivered as the evaluator would generate it, and the
    first is never delivered."""
    from longrm_jax.evaluation.grm.continuous import LiveItem

    generator, (first, second) = _live_generator(causal_lm, 1, 6, (30, 20))
    source = _ArrivingPrompts()
    asked = []

    def gone():
        asked.append(1)
        return len(asked) >= 2  # its client leaves after two round trips

    source.waiting = [LiveItem(first, NEW_TOKENS, lambda result: source.delivered.append(("first", result)), gone),
                      source.item("second", second, 3)]
    source.delivered = [("placeholder", None)]  # `second` ends the run: it makes two deliveries
    pools = []
    generator.generate_live(source, max_length=64, on_pool=pools.append)
    assert [name for name, _ in source.delivered[1:]] == ["second"]
    assert pools[0].get("decode_calls") <= 6  # not the 12 the first prompt's budget takes
    want = generator.generate([second], progress=False, budgets=[3])[0]
    np.testing.assert_array_equal(source.delivered[1][1].tokens, want.tokens)
