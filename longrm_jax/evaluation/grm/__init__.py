"""A generative reward model's judging: greedy decoding of judge prompts with a KV cache, in one place.

* ``generator``: the run's generator from its ``EvalConfig`` (``make_generator``), simulated judgement budgets.
  Each generator call's phase timings come back with its results (``evaluation.timings.Timings``).
* ``generation``: ``GreedyGenerator``, static batches of prompts (prefill, then decode to a stop token), and the
  dispatch to continuous batching; ``decoding``: one prompt's ``Generation`` and the verdict-letter log-probs.
* ``continuous``: continuous batching, a pool of cache slots per length bucket refilled as prompts finish;
  ``slot_plan``: how many slots each bucket gets from the model's shapes and the device's memory.
* ``estimate``: how long a run will take, said before it starts, and each prompt's share of it.
* ``queue``: every task file's judge prompts in one generator call, predictions saved file by file.
* ``simulated_lengths``: judgement lengths for benchmarks of random-weight models.
"""
