"""The GRM generator of an evaluation run and its simulated judgement budgets, shared by Long-RewardBench
judging (``evaluation.runner``) and Long-form pointwise judging (``evaluation.longform``). ``cfg`` is the
run's ``evaluation.runner.EvalConfig``."""

from __future__ import annotations

from longrm_jax.evaluation.encoding import stop_token_ids
from longrm_jax.evaluation.grm.generation import GreedyGenerator
from longrm_jax.evaluation.grm.simulated_lengths import judgement_lengths
from longrm_jax.parallel.topology import GiB


def make_generator(cfg, model, tokenizer, mesh, letter_ids=()):
    """The GRM generator of ``cfg``: continuous batching unless ``static_batches`` (or a multi-device mesh)."""
    memory = int(cfg.device_memory_gib * GiB) if cfg.device_memory_gib else None
    return GreedyGenerator(
        model, pad_id=tokenizer.pad_id, stop_ids=stop_token_ids(cfg.model_path, tokenizer),
        max_new_tokens=cfg.judgement_budget, letter_ids=letter_ids, batch_size=cfg.batch_size,
        max_batch_tokens=cfg.max_batch_tokens, mesh=mesh, continuous=not cfg.static_batches,
        decode_chunk=cfg.decode_chunk, memory_bytes=memory)


def simulated_budgets(cfg, prompts) -> list[int] | None:
    """Per-prompt budgets when ``cfg.simulate_judgement_lengths`` (benchmarks of random-weight models)."""
    if not cfg.simulate_judgement_lengths:
        return None

    return judgement_lengths(prompts, cfg.judgement_budget)
