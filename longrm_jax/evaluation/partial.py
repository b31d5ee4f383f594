"""Partial results of an evaluation: each task file's predictions saved under ``SAVE_PATH/partial`` as soon as
the file is done, with the settings that made them (``result_settings``, the model by content:
``model_fingerprint``), so ``--resume`` reuses a file only when those settings match (docs/design.md,
"Evaluation partial results")."""

from __future__ import annotations

import hashlib
import json
import logging
import os

from longrm_jax.evaluation.samples import EvalSample

logger = logging.getLogger(__name__)


def model_fingerprint(model_path: str) -> str:
    """A hash of a model directory's content, cheap for many-GB checkpoints: every small file (config,
    tokenizer, index) whole; each weight file by its size, its safetensors header (names, dtypes, shapes) and
    samples of its bytes spread over the file (re-trained weights change them). Files up to 64 MiB are hashed
    whole."""
    whole_limit, samples, block = 64 << 20, 32, 64 << 10
    digest = hashlib.sha256()
    for name in sorted(os.listdir(model_path)):
        path = os.path.join(model_path, name)
        if not os.path.isfile(path):
            continue
        size = os.path.getsize(path)
        digest.update(f"{name}\0{size}\0".encode())
        with open(path, "rb") as handle:
            if size <= whole_limit:
                digest.update(handle.read())
                continue
            header = handle.read(8)
            digest.update(handle.read(int.from_bytes(header, "little")) if name.endswith(".safetensors") else b"")
            for k in range(samples):
                handle.seek((size - block) * k // (samples - 1))
                digest.update(handle.read(block))
    return digest.hexdigest()[:32]


def result_settings(cfg) -> dict:
    """The settings that change predictions (a partial result is reused only when they all match). The model
    enters by content: weights re-exported into the same directory are not the model that was evaluated.
    ``cfg``: ``runner.EvalConfig`` (not imported: the runner imports this module)."""
    return {"model": model_fingerprint(cfg.model_path), "is_disrm": cfg.is_disrm, "seed": cfg.seed,
            "max_new_tokens": cfg.judgement_budget, "both_orders": cfg.both_orders, "max_length": cfg.max_length,
            "dtype": cfg.dtype, "limit": cfg.limit, "mesh": cfg.mesh, "share_prompt": cfg.share_prompt,
            "task_types": list(cfg.task_types or []), "longform_protocol": cfg.longform_protocol,
            "longform_max_new_tokens": cfg.max_new_tokens,
            "chat_template": cfg.chat_template, "simulate_judgement_lengths": cfg.simulate_judgement_lengths,
            "decode_attention": cfg.decode_attention}


class PartialResults:
    """Per task file predictions written as each file finishes, so ``--resume`` skips finished files."""

    def __init__(self, directory: str, settings: dict):
        self.directory = directory
        self.settings = settings

    def _path(self, task_file: str) -> str:
        return os.path.join(self.directory, os.path.splitext(os.path.basename(task_file))[0] + ".jsonl")

    def load(self, task_file: str, samples: list[EvalSample]) -> list[dict] | None:
        """The saved predictions of ``task_file`` if made with the same settings for the same samples."""
        path = self._path(task_file)
        if not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8") as handle:
            header = json.loads(handle.readline() or "null")
            records = [json.loads(line) for line in handle if line.strip()]
        if not header or header.get("settings") != self.settings:
            changed = sorted(k for k in set(self.settings) | set((header or {}).get("settings") or {})
                             if (header or {}).get("settings", {}).get(k) != self.settings.get(k))
            logger.warning("%s: made with other settings or another model (%s differ); recomputing", path,
                           ", ".join(changed))
            return None
        if [r["id"] for r in records] != [s.id for s in samples]:
            logger.warning("%s: samples differ from %s; recomputing", path, task_file)
            return None
        return records

    def save(self, task_file: str, predictions: list[dict]) -> None:
        os.makedirs(self.directory, exist_ok=True)
        path = self._path(task_file)
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            handle.write(json.dumps({"settings": self.settings}) + "\n")
            for record in predictions:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        os.replace(path + ".tmp", path)
