"""End-to-end evaluation: read task files, load the model, judge every sample, write the outputs.

Outputs under ``save_path``:

* ``results.csv``: upstream layout (``,Task,Value`` rows, see :func:`metrics.results_rows`); for Long-form
  RewardBench files, one row per subset and ``AVG.``.
* ``results.json``: the same rows plus AUC (definition in :mod:`longrm_jax.evaluation.metrics`), the headline
  ``both_orders_accuracy`` / ``both_orders_agreement`` (the console's names; ``both_orders`` holds the details),
  per-length accuracy, the long-form needle table and the run's settings.
* ``predictions.jsonl``: one line per sample (fields in :mod:`longrm_jax.evaluation.judging`).
* ``accuracy_by_length.png`` (the both-orders figure with ``--both-orders``, else the seeded order's);
  ``needle_heatmap.png`` when long-form records carry needle positions.
* ``partial/{Task}.jsonl``: each task file's predictions as soon as it is done (``--resume`` reuses them;
  :mod:`longrm_jax.evaluation.partial`);
  ``partial/{Task}.journal.jsonl`` while a GRM task file is under way: its finished samples
  (:mod:`longrm_jax.evaluation.grm.queue`; ``--resume`` reuses them too).
* ``{Task}.jsonl`` per Long-RewardBench task, in upstream's own results format (``output``,
  ``shuffled_order``...), so upstream's ``evaluate()`` can re-score our generations.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time

import jax
import numpy as np
from tqdm.auto import tqdm

from longrm_jax.data.records import DataError
from longrm_jax.evaluation import longform, replicas
from longrm_jax.evaluation.config import EvalConfig
from longrm_jax.evaluation.encoding import (
    ModelDirError,
    disrm_sequences_batch,
    load_chat_tokenizers,
)
from longrm_jax.evaluation.grm.generation import prepare_for_decoding
from longrm_jax.evaluation.grm.queue import judge_grm_files
from longrm_jax.evaluation.judging import disrm_prediction, judged_orders
from longrm_jax.evaluation.outputs import summarize, write_outputs
from longrm_jax.evaluation.partial import PartialResults, result_settings
from longrm_jax.evaluation.samples import (
    LONG_FORM,
    BenchDataError,
    EvalSample,
    discover_task_files,
    load_task_file,
)
from longrm_jax.evaluation.scoring import DisRMScorer
from longrm_jax.evaluation.shared_prompt import SharedPromptScorer
from longrm_jax.evaluation.timings import Timings
from longrm_jax.hf.load import CheckpointError, load_pretrained, read_hf_config
from longrm_jax.ops import slow_paths
from longrm_jax.parallel.mesh import make_mesh

logger = logging.getLogger(__name__)



class SavePathInUseError(FileExistsError):
    """--save-path holds the results of an earlier evaluation and neither --resume nor --overwrite was given."""

    exit_code = 2


# Errors caused by the user's inputs (reported as one line by the CLI).
USER_ERRORS = (BenchDataError, DataError, ModelDirError, CheckpointError, SavePathInUseError)
# What an evaluation writes into --save-path (besides {Task}.jsonl): their presence marks earlier results.
RESULT_NAMES = ("results.json", "results.csv", "predictions.jsonl", "timings.json", "partial", "replicas")


def check_save_path(cfg: EvalConfig) -> None:
    """Refuse a save path holding an earlier evaluation's results unless --resume (reuse them) or --overwrite."""
    save = cfg.resolved_save_path()
    if cfg.resume or cfg.overwrite or not os.path.isdir(save):
        return
    found = [name for name in RESULT_NAMES if os.path.exists(os.path.join(save, name))]
    if found:
        raise SavePathInUseError(
            f"{save}: --save-path already holds the results of an earlier evaluation ({', '.join(found)}): pass "
            "--resume to reuse its finished task files, --overwrite to replace them, or another --save-path")


def load_samples(cfg: EvalConfig) -> list[EvalSample]:
    """Every sample of the requested task files, validated before any model is loaded."""
    out = []
    if cfg.task_types:
        unknown = set(cfg.task_types) - {"PairWise", "BestOfN"}
        if unknown:
            raise BenchDataError(f"task types {sorted(unknown)} unknown; choose from PairWise, BestOfN")
    for task, path in discover_task_files(cfg.data_path, cfg.tasks):
        samples = load_task_file(path, task, cfg.seed)
        if cfg.task_types:  # Long-form records have no task type and are kept
            samples = [s for s in samples if s.benchmark == LONG_FORM or s.tasktype in cfg.task_types]
        out.extend(samples if cfg.limit is None else samples[: max(cfg.limit, 0)])
    if cfg.only_samples is not None:  # a replica's share (evaluation.replicas)
        wanted = set(cfg.only_samples)
        out = [s for s in out if s.where in wanted]
    if not out:
        raise BenchDataError(f"{cfg.data_path}: no sample left to evaluate (--task-types {cfg.task_types})")
    return out


def resolve_dtype(cfg: EvalConfig) -> str:
    """The compute dtype of ``cfg.dtype`` "auto": a DisRM scores in the checkpoint's stored dtype (its
    config.json ``torch_dtype`` / ``dtype``), since bfloat16 rounds the close scores of an answer pair into ties
    and flips (tiny fp32 BT model, --both-orders agreement 0.49 in bfloat16, 1.0 in float32); a GRM's greedy
    verdict tolerates bfloat16, the fast decode dtype."""
    if cfg.dtype != "auto":
        return cfg.dtype
    if not cfg.is_disrm:
        return "bfloat16"

    hf_config = read_hf_config(cfg.model_path)
    stored = str(hf_config.get("torch_dtype") or hf_config.get("dtype") or "")
    return stored if stored in ("float32", "bfloat16", "float16") else "float32"


def build_mesh(spec: dict[str, int] | None):
    if not spec:
        return None

    return make_mesh(**spec)


def check_model_kind(cfg: EvalConfig) -> None:
    """Refuse a head that does not fit the evaluation mode (a causal LM scored by a random new score head, or a
    classifier asked to generate), suggesting the flag that fits."""
    architectures = read_hf_config(cfg.model_path).get("architectures") or []  # names the problem if unreadable
    names = ", ".join(architectures)
    classifier = any(a.endswith("ForSequenceClassification") for a in architectures)
    causal = any(a.endswith("ForCausalLM") for a in architectures)
    if cfg.is_disrm and causal and not classifier:
        raise ModelDirError(f"{cfg.model_path}: a causal LM ({names}) has no trained score head for --is-disrm; "
                            "drop --is-disrm to evaluate it as a generative judge")
    if not cfg.is_disrm and classifier and not causal:
        raise ModelDirError(f"{cfg.model_path}: a sequence classifier ({names}) cannot generate verdicts; "
                            "pass --is-disrm to score answers with its reward head")


# Unrolling a decode step's layer loop (with the decode kernel) makes each token ~5% faster (H200, Qwen3-8B, 32K
# context, batch 1: 164 -> 173 tokens/s, 0.33 ms per token) and each decode program ~8 s slower to compile. A run
# compiles one decode program per cache-length plan (up to ~6): below this many budgeted tokens the compiles
# cost more than they save (the whole-benchmark slice of docs/perf_eval.md, 35 samples x 256 tokens, lost 35 s
# of compile for 2 s of decode).
UNROLL_MIN_DECODE_TOKENS = 200_000


def unroll_decode_layers(cfg: EvalConfig, samples: int) -> bool:
    """Whether GRM decode steps with the decode kernel unroll the layer loop. ``auto``: when the run's token
    budget (samples x max_new_tokens) reaches :data:`UNROLL_MIN_DECODE_TOKENS`."""
    if cfg.unroll_decode_layers not in ("auto", "on", "off"):
        raise ValueError(f"unroll_decode_layers must be auto, on or off, got {cfg.unroll_decode_layers!r}")
    if cfg.unroll_decode_layers != "auto":
        return cfg.unroll_decode_layers == "on"
    return samples * cfg.judgement_budget >= UNROLL_MIN_DECODE_TOKENS


def load_model(cfg: EvalConfig, mesh, samples: int = 0):
    """The model as the evaluation runs it: a generative judge in the decoding weight layout (fused q/k/v and
    gate/up projections, built once here) for a run of ``samples`` samples."""
    model = load_pretrained(cfg.model_path, dtype=cfg.dtype, mesh=mesh,
                            head="classifier" if cfg.is_disrm else "causal_lm")
    if not cfg.is_disrm:
        unroll = unroll_decode_layers(cfg, samples)
        prepare_for_decoding(model, mesh, cfg.decode_attention, unroll_layers=unroll)
        logger.info("decode attention %s, layer loop %s", model.config.decode_attention,
                    "unrolled" if model.config.unroll_cached_layers else "scanned")
    return model


def _progress(items, cfg: EvalConfig, desc: str):
    return tqdm(items, desc=desc, unit="sample", disable=not cfg.progress)


def run_disrm(cfg: EvalConfig, samples: list[EvalSample], model, tokenizer, mesh,
              run_samples: int = 0) -> tuple[list[dict], Timings]:
    """(predictions, timings) of one task file's ``samples``; ``run_samples``: samples in the whole run (bucket
    planning)."""
    sequences, owners, truncated = [], [], []
    step = 16  # samples per tokenizer batch (the Rust tokenizer spreads a batch over the cores)
    with _progress(samples, cfg, "tokenizing") as bar:
        for start in range(0, len(samples), step):
            batch = disrm_sequences_batch(samples[start:start + step], tokenizer, cfg.max_length)
            for s_index, pairs in enumerate(batch, start):
                for ids, cut in pairs:
                    sequences.append(ids)
                    owners.append(s_index)
                    truncated.append(cut)
            bar.update(len(batch))
    pad_id = model.config.pad_token_id
    pad_id = tokenizer.pad_id if pad_id is None else pad_id
    per_sample: dict[int, list[int]] = {}
    for seq_index, owner in enumerate(owners):
        per_sample.setdefault(owner, []).append(seq_index)
    if cfg.share_prompt and (mesh is None or mesh.size == 1):
        shared = SharedPromptScorer(model, pad_id)
        scores = np.zeros(len(sequences), np.float32)
        groups = [[sequences[i] for i in per_sample[s_index]] for s_index in range(len(samples))]
        repeats = max(1.0, run_samples / max(1, len(samples)))
        for s_index, group_scores in enumerate(shared.score_groups(groups, progress=cfg.progress, repeats=repeats)):
            scores[per_sample[s_index]] = group_scores
        timings = Timings(shared.timings)
    else:
        if cfg.share_prompt:
            logger.warning("--share-prompt needs a single device; scoring every sequence whole")
        scorer = DisRMScorer(model, pad_id, batch_size=cfg.batch_size or 4, max_batch_tokens=cfg.max_batch_tokens,
                             mesh=mesh)
        scores = scorer.score(sequences, progress=cfg.progress)
        timings = Timings()
    predictions = []
    for s_index, sample in enumerate(samples):
        members = per_sample[s_index]
        predictions.append(disrm_prediction(
            sample, [float(scores[i]) for i in members], judged_orders(sample, cfg.both_orders),
            [len(sequences[i]) for i in members], [truncated[i] for i in members]))
    return predictions, timings


def run_grm(cfg: EvalConfig, samples: list[EvalSample], model, tokenizer, mesh,
            partial=None) -> tuple[list[dict], Timings]:
    """(judgements, timings) of one task file's ``samples`` (the ``--queue per-task`` schedule); ``partial``
    (:class:`PartialResults`) journals finished samples (default: under the run's save path)."""
    partial = partial or PartialResults(os.path.join(cfg.resolved_save_path(), "partial"), result_settings(cfg))
    path = samples[0].file
    by_path, timings = judge_grm_files(cfg, [(path, samples)], model, tokenizer, mesh, partial)
    return by_path[path], timings


def _by_file(samples: list[EvalSample]) -> list[tuple[str, list[EvalSample]]]:
    groups: dict[str, list[EvalSample]] = {}
    for sample in samples:
        groups.setdefault(sample.file, []).append(sample)
    return list(groups.items())


def run_evaluation(cfg: EvalConfig) -> dict:
    """Evaluate ``cfg.model_path`` on ``cfg.data_path``; returns the summary written to ``results.json``.
    ``cfg.replicas`` other than 1 may share the samples out to one process per GPU (evaluation.replicas), each
    started with ``cfg`` for its share."""
    started = time.time()
    cfg, samples, grm_tokenizer, disrm_tokenizer = prepare_run(cfg)
    if cfg.replicas != "1":
        routed = replicas.judge_on_replicas(cfg, samples)
        if routed is not None:
            by_place, too_long, devices, timings = routed
            if too_long:
                begin = time.time()
                long_predictions, long_timings = judge_long_on_mesh(cfg, too_long, devices, grm_tokenizer,
                                                                    disrm_tokenizer)
                by_place.update(long_predictions)
                timings.set(long_samples=len(too_long), long_judging_s=time.time() - begin,
                            long_timings=long_timings)
            predictions = [by_place[(s.file, s.row)] for s in samples]
            return finish_run(cfg, samples, predictions, started, timings,
                              device_kind=timings.get("device") if not too_long else None)
    predictions, timings = judge_samples(cfg, samples, grm_tokenizer, disrm_tokenizer)
    return finish_run(cfg, samples, predictions, started, timings)


def judge_long_on_mesh(cfg: EvalConfig, samples: list[EvalSample], devices: int, grm_tokenizer,
                       disrm_tokenizer) -> tuple[dict[tuple[str, int], dict], Timings]:
    """(predictions by (file, row), timings) of the samples too long for one replica's device, judged in this
    process by one program whose ``seq`` axis spans ``devices`` devices (ring-attention prefill, the cache split
    along the sequence; fsdp takes any devices left), as ``--mesh seq=N`` runs; its journals under
    SAVE_PATH/replicas/long/ (``--resume`` works)."""
    save = os.path.join(cfg.resolved_save_path(), replicas.REPLICA_DIR, "long")
    os.makedirs(save, exist_ok=True)
    long_cfg = dataclasses.replace(cfg, mesh={"seq": devices, "fsdp": -1}, save_path=save, share_prompt=False)
    predictions, timings = judge_samples(long_cfg, samples, grm_tokenizer, disrm_tokenizer)
    return {(p["file"], p["row"]): p for p in predictions}, timings


def prepare_run(cfg: EvalConfig):
    """Check the run's settings and inputs, load the tokenizers and the samples: (``cfg`` with ``dtype``
    resolved, samples, GRM tokenizer, DisRM tokenizer); ``cfg`` itself is left as given. Touches no device."""
    data_dir = cfg.data_path if os.path.isdir(cfg.data_path) else os.path.dirname(cfg.data_path)
    if os.path.realpath(cfg.resolved_save_path()) == os.path.realpath(data_dir):
        raise BenchDataError(f"{cfg.resolved_save_path()}: --save-path must differ from the data directory "
                             "(per-task result files would overwrite the task files)")
    if cfg.longform_protocol not in longform.PROTOCOLS:
        raise BenchDataError(f"longform protocol must be one of {', '.join(longform.PROTOCOLS)}, "
                             f"got {cfg.longform_protocol!r}")
    if cfg.queue not in ("run", "per-task"):
        raise BenchDataError(f"queue must be run or per-task, got {cfg.queue!r}")
    check_save_path(cfg)
    check_model_kind(cfg)
    if cfg.dtype == "auto":
        cfg = dataclasses.replace(cfg, dtype=resolve_dtype(cfg))
        logger.info("compute dtype %s (%s; --dtype to choose)", cfg.dtype,
                    "the checkpoint's" if cfg.is_disrm else "generative judge default")
    disrm_tokenizer, grm_tokenizer = load_chat_tokenizers(cfg.model_path, cfg.chat_template)
    samples = load_samples(cfg)
    logger.info("%d samples from %s", len(samples), cfg.data_path)
    return cfg, samples, grm_tokenizer, disrm_tokenizer


def judge_samples(cfg: EvalConfig, samples: list[EvalSample], grm_tokenizer,
                  disrm_tokenizer) -> tuple[list[dict], Timings]:
    """(every sample's prediction in ``samples``' order, the run's timings); task files finished earlier are
    reused under --resume."""
    partial = PartialResults(os.path.join(cfg.resolved_save_path(), "partial"), result_settings(cfg))
    mesh = model = None
    timings = Timings()
    by_file: dict[str, list[dict]] = {}
    queued = []  # GRM task files judged together (evaluation.grm.queue)
    for path, group in _by_file(samples):
        done = partial.load(path, group) if cfg.resume else None
        if done is not None:
            logger.info("%s: reusing %d predictions from %s", path, len(done), partial.directory)
            by_file[path] = done
            continue
        if model is None:  # loaded only when some task file still needs the model
            begin = time.time()
            mesh = build_mesh(cfg.mesh)
            model = load_model(cfg, mesh, samples=len(samples))
            timings.add({"load_s": time.time() - begin})
        pointwise = group[0].benchmark == LONG_FORM and cfg.longform_protocol in ("upstream", "pointwise")
        if not cfg.is_disrm and not pointwise and cfg.queue == "run":
            queued.append((path, group))
            continue
        begin = time.time()
        if cfg.is_disrm:
            done, phases = run_disrm(cfg, group, model, disrm_tokenizer, mesh, run_samples=len(samples))
        elif pointwise:
            done, phases = longform.run_pointwise_grm(cfg, group, model, grm_tokenizer, mesh)
        else:
            done, phases = run_grm(cfg, group, model, grm_tokenizer, mesh, partial)
        timings.add(phases).add({"judging_s": time.time() - begin})
        partial.save(path, done)
        by_file[path] = done
    if queued:
        begin = time.time()
        judged, phases = judge_grm_files(cfg, queued, model, grm_tokenizer, mesh, partial)
        by_file.update(judged)
        timings.add(phases).add({"judging_s": time.time() - begin})
    return [p for path, _ in _by_file(samples) for p in by_file[path]], timings


def finish_run(cfg: EvalConfig, samples: list[EvalSample], predictions: list[dict], started: float,
               timings: Timings, device_kind: str | None = None) -> dict:
    """Summarise ``predictions`` and write every output; returns the summary."""
    # results.csv lists the evaluated tasks in evaluation order (upstream: its task list, default all 7).
    begin = time.time()
    tasks = list(dict.fromkeys(s.task for s in samples if s.benchmark != LONG_FORM))
    summary = summarize(predictions, tasks)
    settings = dataclasses.asdict(cfg)
    settings.update(model_type="Discriminative RM" if cfg.is_disrm else "Generative RM",
                    seconds=round(time.time() - started, 1))
    summary["timings"] = timings.as_dict()  # written below; aggregation_s covers summarising and writing

    summary["slow_paths"] = slow_paths.counts()  # fallbacks taken (ops.slow_paths), {} when none
    write_outputs(cfg.resolved_save_path(), predictions, summary, settings)
    timings.set(aggregation_s=time.time() - begin, total_s=time.time() - started,
                device=device_kind or jax.devices()[0].device_kind)  # which device these seconds are of
    with open(os.path.join(cfg.resolved_save_path(), "timings.json"), "w") as handle:
        json.dump(timings.as_dict(), handle, indent=2)
    return summary
