"""Synthetic long-context preference data that can only be judged by reading the context.

A *needle* fact ("The password of the blue vault is falcon.") sits at a random depth of a haystack of filler
sentences (which never mention keys or passwords). The question asks for the password; the chosen answer
states the true value, each rejected answer a different value from the same small set, in the same words,
so chosen and rejected have the same template and token length: nothing but the context separates them.
`num_distractors > 0` adds facts about other keys (harder: the key must be matched too).

The generator itself (needles, haystacks, answers, the benchmark row) is `data.needles`.

Writers (deterministic by seed):
- `write_training_files(out_dir, ...)`: `{train,eval}.jsonl` in the upstream preference format
  (`chat_template` messages, `chosen` str, `rejects` list) and `sft_{train,eval}.jsonl` in the upstream SFT
  format (`chat_template`, `golden`).
- `write_long_rewardbench(out_dir, ...)`: `{Task}.jsonl` Long-RewardBench task files with every field of
  docs/upstream.md ("Long-RewardBench"). Pairwise rows ask for one password; Best-of-N rows with n candidates ask for n-1
  passwords and candidate j (best first) gets n-1-j of them right (`candidates_score` = number right).
- `write_judge_files(out_dir, ...)` (`data.synthetic_judge`): training files for a *generative* judge (GRM stage 1 SFT, stage 2 SimPO).
  Each row is a pairwise Long-RewardBench row (the same generator as the benchmark) shown to the judge in the
  evaluator's exact judge prompt (`data.judge_prompts`, answers in a random order); the target judgement names
  the answer whose password the document states and ends with the verdict the evaluator parses
  (`judgement_text`). SimPO's rejected judgement names the other answer.

CLI: `python -m longrm_jax.data.synthetic --out DIR [--num-train N] [--lengths 32,64,128,256] ...`.
Lengths are context lengths in tokens of `count_tokens` (default: the committed tiny tokenizer).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Callable, Sequence

from longrm_jax.cli_support import InputError, add_debug_flag, cli_parser, run_cli
from longrm_jax.data.needles import (DEFAULT_LENGTHS, VALUES, answer_text, approx_token_count, bench_row,
                                     default_token_counter, length_label, make_needle_sample, wrong_values,
                                     write_jsonl)
from longrm_jax.data.records import LONG_REWARDBENCH_TASKS
from longrm_jax.data.synthetic_judge import JUDGEMENT_STYLES, write_judge_files


def preference_row(rng: random.Random, target_tokens: int, num_rejects: int = 1, num_distractors: int = 0,
                   count_tokens: Callable[[str], int] = approx_token_count, values: Sequence[str] = VALUES
                   ) -> dict:
    """One upstream-format preference row (`chat_template`, `chosen`, `rejects`) plus provenance fields."""
    s = make_needle_sample(rng, target_tokens, 1, num_distractors, count_tokens, values)
    rejects = [answer_text(s.keys, [v]) for v in wrong_values(rng, s.values[0], num_rejects, values)]
    return {
        "chat_template": s.messages(),
        "chosen": answer_text(s.keys, s.values),
        "rejects": rejects,
        "ctx_length": length_label(target_tokens),
        "prompt_ctx_length": s.context_tokens,
        "depth": round(s.depths[0], 4),
        "key": " ".join(s.keys[0]),
        "answer": s.values[0],
    }


def sft_row(pref: dict) -> dict:
    return {"chat_template": pref["chat_template"], "golden": pref["chosen"], "ctx_length": pref["ctx_length"],
            "depth": pref["depth"]}


def training_rows(n: int, seed: int, lengths: Sequence[int], num_rejects: int = 1, num_distractors: int = 0,
                  count_tokens: Callable[[str], int] | None = None, num_values: int = len(VALUES)) -> list[dict]:
    """`n` preference rows, context lengths cycling through `lengths` (tokens).

    `num_values` (2..16) restricts the passwords to the first values of `VALUES` (an easier task).
    """
    if not num_rejects + 1 <= num_values <= len(VALUES):
        raise ValueError(f"num_values must be in [{num_rejects + 1}, {len(VALUES)}], got {num_values}")
    count_tokens = count_tokens or default_token_counter()
    rng = random.Random(seed)
    return [preference_row(rng, lengths[i % len(lengths)], num_rejects, num_distractors, count_tokens,
                           VALUES[:num_values]) for i in range(n)]


def write_training_files(out_dir: str, num_train: int = 2000, num_eval: int = 200, seed: int = 0,
                         lengths: Sequence[int] = DEFAULT_LENGTHS, num_rejects: int = 1,
                         num_distractors: int = 0, count_tokens: Callable[[str], int] | None = None,
                         num_values: int = len(VALUES)) -> dict[str, str]:
    """Write preference (`train.jsonl`, `eval.jsonl`) and SFT (`sft_train.jsonl`, `sft_eval.jsonl`) files.

    The eval split uses a different seed stream, so it is held out. Returns {name: path}.
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for split, n, split_seed in (("train", num_train, seed), ("eval", num_eval, seed + 1_000_003)):
        rows = training_rows(n, split_seed, lengths, num_rejects, num_distractors, count_tokens, num_values)
        paths[split] = os.path.join(out_dir, f"{split}.jsonl")
        paths[f"sft_{split}"] = os.path.join(out_dir, f"sft_{split}.jsonl")
        write_jsonl(paths[split], rows)
        write_jsonl(paths[f"sft_{split}"], [sft_row(r) for r in rows])
    return paths


def write_long_rewardbench(out_dir: str, per_task: int = 20, seed: int = 0,
                           lengths: Sequence[int] = DEFAULT_LENGTHS,
                           tasks: Sequence[str] = LONG_REWARDBENCH_TASKS, bon_fraction: float = 0.3,
                           num_distractors: int = 0, count_tokens: Callable[[str], int] | None = None
                           ) -> dict[str, str]:
    """Write `{Task}.jsonl` for each task: about `bon_fraction` Best-of-N rows (n = 2, 3, 4 cycling).

    Each task has its own random stream, named by task and seed (a string: no training-file stream, which are
    integers or other names, is the same, so the benchmark is held out from training files of any seed).
    Returns {task: path}.
    """
    count_tokens = count_tokens or default_token_counter()
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for task in tasks:
        rng = random.Random(f"bench-{task}:{seed}")
        n_bon = int(round(per_task * bon_fraction))
        rows = []
        for i in range(per_task):
            n_cand = 2 if i >= n_bon else (2, 3, 4)[i % 3]
            rows.append(bench_row(rng, task, i, lengths[i % len(lengths)], n_cand, count_tokens,
                                  num_distractors, best_of_n=i < n_bon))
        paths[task] = os.path.join(out_dir, f"{task}.jsonl")
        write_jsonl(paths[task], rows)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_write, argv)


def _write(argv: Sequence[str]) -> int:
    p = cli_parser("longrm_jax.data.synthetic", "Write synthetic needle-in-a-haystack preference data (training rows "
                   "and Long-RewardBench task files).", show_defaults=True)
    p.add_argument("--out", required=True, default=argparse.SUPPRESS, help="output directory")
    p.add_argument("--num-train", type=int, default=2000, help="training rows (train.jsonl)")
    p.add_argument("--num-eval", type=int, default=200, help="held-out rows (eval.jsonl)")
    p.add_argument("--bench-per-task", type=int, default=20, help="rows per Long-RewardBench task file")
    p.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)), help="context lengths in tokens, comma separated")
    p.add_argument("--num-rejects", type=int, default=1, help="rejected responses per training row")
    p.add_argument("--num-distractors", type=int, default=0, help="extra facts about other keys")
    p.add_argument("--num-values", type=int, default=len(VALUES), help="distinct passwords in training rows")
    p.add_argument("--bench-bon-fraction", type=float, default=0.3,
                   help="share of Best-of-N rows in the Long-RewardBench files (0: pairwise only)")
    p.add_argument("--judge", action="store_true",
                   help="also write judge training files: judge_sft_{train,eval}.jsonl (GRM SFT) and "
                        "judge_{train,eval}.jsonl (GRM SimPO), pairwise rows in the evaluator's judge prompt, "
                        "verify_sft_{train,eval}.jsonl (SFT rows of the judge's verification task), "
                        "lookup_sft_{train,eval}.jsonl (letters looked up by password, for the needle LM) and "
                        "disrm_{train,eval}.jsonl (DisRM Bradley-Terry) in the benchmark's prompt")
    p.add_argument("--judgement", choices=JUDGEMENT_STYLES, default="echo",
                   help="how the judge's judgements reach their verdict: echo (list the answers' passwords with "
                        "their letters, then copy the letter after the document's password; learned in about 500 "
                        "steps) or check (compare each answer with the document in turn; 800-1,300 steps)")
    p.add_argument("--seed", type=int, default=0, help="the same seed writes the same files")
    add_debug_flag(p)
    args = p.parse_args(argv)
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        p.error(f"--lengths {args.lengths!r}: expected comma-separated integers")
    # Checked before anything is written: a bad count would otherwise leave a partial set of files.
    for flag, value, least in (("--num-train", args.num_train, 0), ("--num-eval", args.num_eval, 0),
                               ("--bench-per-task", args.bench_per_task, 0), ("--num-rejects", args.num_rejects, 1),
                               ("--num-distractors", args.num_distractors, 0), ("--num-values", args.num_values, 1),
                               *(("--lengths", n, 1) for n in lengths)):
        if value < least:
            p.error(f"{flag} {value}: expected an integer >= {least}")
    if not args.num_rejects + 1 <= args.num_values <= len(VALUES):  # a rejected answer needs a wrong password
        p.error(f"--num-values {args.num_values}: expected {args.num_rejects + 1} (--num-rejects + 1) to {len(VALUES)} "
                "(the number of passwords)" if args.num_rejects + 1 <= len(VALUES) else
                f"--num-rejects {args.num_rejects}: at most {len(VALUES) - 1} (one fewer than the {len(VALUES)} "
                "passwords)")
    if not 0.0 <= args.bench_bon_fraction <= 1.0:
        p.error(f"--bench-bon-fraction {args.bench_bon_fraction}: expected a fraction in [0, 1]")
    # A file at --out (or above it) made os.makedirs raise "[Errno 17] File exists" (exit 1, no flag named).
    blocker = next((path for path in _parents(args.out) if os.path.exists(path) and not os.path.isdir(path)), None)
    if blocker is not None:
        raise InputError(f"--out {args.out}: " + ("is a file; a directory is needed (the files are written inside "
                                                  "it)" if blocker == os.path.normpath(args.out) else
                                                  f"{blocker} is a file, not a directory"))
    paths = write_training_files(args.out, args.num_train, args.num_eval, args.seed, lengths, args.num_rejects,
                                 args.num_distractors, num_values=args.num_values)
    if args.judge:
        paths.update(write_judge_files(args.out, args.num_train, args.num_eval, args.seed, lengths,
                                       args.num_distractors, style=args.judgement))
    paths.update(write_long_rewardbench(os.path.join(args.out, "long_rewardbench"), args.bench_per_task,
                                        args.seed, lengths, bon_fraction=args.bench_bon_fraction,
                                        num_distractors=args.num_distractors))
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


def _parents(path: str) -> list[str]:
    """``path`` and each directory above it as written, nearest first."""
    out, path = [], os.path.normpath(path)
    while path and path not in out:
        out.append(path)
        path = os.path.dirname(path)
    return out


if __name__ == "__main__":
    sys.exit(main())
