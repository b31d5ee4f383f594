"""Training batches packed in memory, without the grain pipeline: small tests look at every row."""

from longrm_jax.data.tokenize import ChatTokenizer
from longrm_jax.training.config import TrainConfig
from longrm_jax.training.data_source import packed_batches, train_records


def train_batches(cfg: TrainConfig, tokenizer: ChatTokenizer) -> list[dict]:
    """Every global training batch of one epoch, packed in memory."""
    return packed_batches(cfg, tokenizer, train_records(cfg), sft=cfg.stage == "sft",
                          batch_rows=cfg.pipeline_rows_per_step)
