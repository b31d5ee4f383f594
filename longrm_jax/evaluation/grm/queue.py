"""One GRM generation queue for the task files of a run, journaled as samples finish.

Judging task file by task file gives each length bucket of a file only that file's prompts: a 5-sample file
holds one prompt per bucket, so every slot pool runs at batch 1. Here the judge prompts of every queued file
(both orders with ``--both-orders``) go into one generator call, whose continuous batching groups them by
length bucket, longest first (:mod:`longrm_jax.evaluation.grm.continuous`): a bucket's slots fill with prompts of
every task. The evaluator's ``--queue per-task`` calls :func:`judge_grm_files` once per file instead (the old
schedule; same predictions).

Results stay per task file. As each sample's last prompt finishes, its prediction is appended to
``partial/{Task}.journal.jsonl``; when a file's last sample is done, ``partial/{Task}.jsonl`` is written
(what ``--resume`` reuses whole) and its journal removed. ``--resume`` after a kill reuses the journaled
samples of unfinished files and queues only the rest (a journal line cut by the kill is dropped).

Verdict letters: the generator records the log-probs of as many letters as the run's largest sample has
answers; each file's predictions read them with the letter count of that file (as when judged alone), so a
verdict parses the same in either schedule.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence

import jax
from tqdm.auto import tqdm

from longrm_jax.evaluation.grm.continuous import param_bytes
from longrm_jax.evaluation.encoding import grm_prompt_ids, verdict_letter_token_ids
from longrm_jax.evaluation.grm.estimate import estimate_run
from longrm_jax.evaluation.grm.generator import make_generator, simulated_budgets
from longrm_jax.evaluation.timings import Timings
from longrm_jax.evaluation.judging import grm_prediction, judged_orders
from longrm_jax.evaluation.samples import EvalSample

logger = logging.getLogger(__name__)


class TaskJournal:
    """``{directory}/{Task}.journal.jsonl``: a header line with the run's settings, then one line per finished
    sample of an unfinished task file (``{"sample": index in the file, "prediction": {...}}``)."""

    def __init__(self, directory: str, settings: dict, task_file: str):
        self.settings = settings
        self.path = os.path.join(directory, os.path.splitext(os.path.basename(task_file))[0] + ".journal.jsonl")

    def _read(self, samples: Sequence[EvalSample]) -> dict[int, dict]:
        with open(self.path, encoding="utf-8") as handle:
            lines = handle.read().split("\n")
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError:
            header = None
        if not header or header.get("settings") != self.settings:
            logger.warning("%s: made with other settings or another model; not reused", self.path)
            return {}
        reused: dict[int, dict] = {}
        for number, line in enumerate(lines[1:], 2):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:  # the line a kill cut short: only the last one can be
                logger.warning("%s:%d: incomplete line dropped (the run was stopped while writing it)", self.path,
                               number)
                break
            index = entry.get("sample")
            if not isinstance(index, int) or not 0 <= index < len(samples) or \
                    entry["prediction"].get("id") != samples[index].id:
                logger.warning("%s:%d: sample %r is not in the task file any more; journal not reused", self.path,
                               number, index)
                return {}
            reused[index] = entry["prediction"]
        return reused

    def start(self, samples: Sequence[EvalSample], resume: bool) -> dict[int, dict]:
        """The journaled predictions to reuse (``resume``), by sample index; the journal is rewritten to hold
        exactly those, and later samples are appended to it."""
        reused = self._read(samples) if resume and os.path.isfile(self.path) else {}
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path + ".tmp", "w", encoding="utf-8") as handle:
            handle.write(json.dumps({"settings": self.settings}) + "\n")
            for index, prediction in sorted(reused.items()):
                handle.write(self._line(index, prediction))
        os.replace(self.path + ".tmp", self.path)
        return reused

    @staticmethod
    def _line(index: int, prediction: dict) -> str:
        return json.dumps({"sample": index, "prediction": prediction}, ensure_ascii=False) + "\n"

    def append(self, index: int, prediction: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(self._line(index, prediction))

    def remove(self) -> None:
        if os.path.exists(self.path):
            os.remove(self.path)


class _FileJob:
    """A queued task file: its samples, finished predictions (by sample index) and letter ids."""

    def __init__(self, path: str, samples: list[EvalSample], journal: TaskJournal, letter_ids: list[int]):
        self.path, self.samples, self.journal, self.letter_ids = path, samples, journal, letter_ids
        self.done: dict[int, dict] = {}
        self.saved = False


def _file_jobs(cfg, files: Sequence[tuple[str, list[EvalSample]]], tokenizer, partial) -> list[_FileJob]:
    """A job per task file, with the samples its journal already holds (``--resume``)."""
    jobs = []
    for path, samples in files:
        journal = TaskJournal(partial.directory, partial.settings, path)
        letters = verdict_letter_token_ids(tokenizer, max(len(s.answers) for s in samples))
        job = _FileJob(path, samples, journal, letters)
        job.done = journal.start(samples, cfg.resume)
        if job.done:
            logger.info("%s: reusing %d of %d judged samples from %s", path, len(job.done), len(samples),
                        journal.path)
        jobs.append(job)
    return jobs


def _judge_prompts(cfg, jobs: list[_FileJob], todo: list[tuple[int, int]], tokenizer):
    """(prompt ids, owners[i] = (job, sample index, shown order), each prompt's cut, members[(job, sample)] =
    its prompts' indices) for the samples ``todo``: one prompt per judged order."""
    prompts, owners, cuts = [], [], []
    members: dict[tuple[int, int], list[int]] = {}
    for j, s in tqdm(todo, desc="building judge prompts", unit="sample", disable=not cfg.progress):
        sample = jobs[j].samples[s]
        for order in judged_orders(sample, cfg.both_orders):
            ids, cut = grm_prompt_ids(sample, tokenizer, order, cfg.max_length)
            members.setdefault((j, s), []).append(len(prompts))
            prompts.append(ids)
            owners.append((j, s, order))
            cuts.append(cut)
    return prompts, owners, cuts, members


def judge_grm_files(cfg, files: Sequence[tuple[str, list[EvalSample]]], model, tokenizer, mesh,
                    partial) -> tuple[dict[str, list[dict]], Timings]:
    """(predictions by task file, the generator's timings) of every sample of ``files`` ((task file, samples)
    pairs), judged in one generator call;
    ``partial`` (``partial.PartialResults``) receives each file as it completes. ``cfg``: ``runner.EvalConfig``."""
    jobs = _file_jobs(cfg, files, tokenizer, partial)
    todo = [(j, s) for j, job in enumerate(jobs) for s in range(len(job.samples)) if s not in job.done]
    prompts, owners, cuts, members = _judge_prompts(cfg, jobs, todo, tokenizer)

    def finish_file(job: _FileJob) -> None:
        partial.save(job.path, [job.done[s] for s in range(len(job.samples))])
        job.journal.remove()
        job.saved = True

    timings = Timings()
    if prompts:
        run_letters = verdict_letter_token_ids(tokenizer, max(len(job.letter_ids) for job in jobs))
        generator = make_generator(cfg, model, tokenizer, mesh, run_letters)
        budgets = simulated_budgets(cfg, prompts)
        weights, estimate_s = prompt_weights(cfg, generator, model, prompts, budgets)
        generations: list = [None] * len(prompts)
        remaining = {key: len(value) for key, value in members.items()}
        bar = tqdm(total=sum(weights), desc=f"judging {len(todo)} samples ({len(prompts)} prompts)",
                   unit="est-s", disable=not cfg.progress,
                   bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]{postfix}")
        finished_prompts = [0]

        def on_result(index: int, generation) -> None:
            generations[index] = generation
            finished_prompts[0] += 1
            bar.set_postfix_str(f"{finished_prompts[0]}/{len(prompts)} prompts", refresh=False)
            bar.update(weights[index])
            j, s, _ = owners[index]
            remaining[(j, s)] -= 1
            if remaining[(j, s)]:
                return
            job, mine = jobs[j], members[(j, s)]
            prediction = grm_prediction(
                job.samples[s], [owners[i][2] for i in mine], [generations[i] for i in mine], tokenizer.hf,
                job.letter_ids, [len(prompts[i]) for i in mine], [cuts[i] for i in mine])
            for i in mine:
                generations[i] = None  # judged: its tokens and letter log-probs are no longer needed
            job.done[s] = prediction
            job.journal.append(s, prediction)
            if len(job.done) == len(job.samples):
                finish_file(job)

        generator.generate(prompts, progress=False, budgets=budgets, on_result=on_result)
        bar.close()
        timings.add(generator.timings)
        if estimate_s is not None:
            timings.add({"estimate_s": estimate_s})
    for job in jobs:
        if not job.saved:  # every sample reused from the journal
            finish_file(job)
    return {job.path: [job.done[s] for s in range(len(job.samples))] for job in jobs}, timings


def prompt_weights(cfg, generator, model, prompts, budgets) -> tuple[list[float], float | None]:
    """(each prompt's estimated seconds: the progress bar's weights, the run's estimated seconds or None); logs
    the estimate. Static batches (no slot plan): weights of prompt plus budget tokens, no estimate."""
    budgets = budgets or [cfg.judgement_budget] * len(prompts)
    lengths = [len(p) for p in prompts]
    pools = generator.slot_plan(lengths)
    if pools is None:
        logger.info("static batches: no slot plan, no time estimate (progress weighted by tokens)")
        return [float(n + b) for n, b in zip(lengths, budgets)], None

    estimate = estimate_run(model.config, param_bytes(model), pools, lengths, budgets, jax.devices()[0].device_kind,
                            unrolled=bool(getattr(model.config, "unroll_cached_layers", False)))
    logger.info("%s", estimate.message())  # the slot plan itself is logged as generation starts
    return estimate.prompt_seconds, estimate.total_s if estimate.rates else None
