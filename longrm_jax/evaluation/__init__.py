"""Long-RewardBench / Long-form RewardBench evaluation of generative and discriminative reward models.

Modules, from inputs to outputs:

* ``samples``: task files read through ``longrm_jax.data.readers``, the upstream seeded answer permutation.
* ``prompts``: judge prompts and verdict parsers (upstream LongRM's, quirks included).
* ``encoding``: token ids for DisRM sequences and GRM judge prompts (chat templates, middle truncation).
* ``batching``: length buckets and static-shape batch plans.
* ``scoring``: jitted DisRM scoring (``DisRMScorer``); ``shared_prompt``: the same with a sample's shared prompt
  computed once. ``grm``: a judge's greedy decoding with a KV cache (static and continuous batching, slot plans,
  the run estimate, the queue of task files). Both run on a device mesh, with ring attention when it has a
  ``seq`` axis.
* ``judging``: model outputs -> per-sample predictions; ``metrics``: upstream ``results.csv`` rows, AUC,
  both-orders agreement; ``plots``: accuracy by length, needle heatmap.
* ``longform``: Long-form RewardBench judging (the upstream, pointwise and joint protocols).
* ``partial``: per-task predictions journaled for ``--resume``; ``outputs``: results.json, results.csv,
  predictions.jsonl; ``timings``: the run's phase seconds and counts, returned by each part and added up.
* ``replicas``: one process per GPU, each on a share of the samples, merged into one run's outputs.
* ``config``: ``EvalConfig``, the evaluator's settings (the CLI's flags are generated from it); ``compile_only``:
  evaluation programs compiled for a topology.
* ``runner``: ``run_evaluation`` (the CLI is ``python -m longrm_jax.evaluate``).
"""
