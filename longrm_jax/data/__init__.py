"""Data: readers (formats and sources), chat tokenization with loss masks, packing, the grain training
pipeline, synthetic needle data and the tiny tokenizer. Knows tokenizers and formats, not models.

Main entry points:
- `readers.RecordSource` / `readers.read_records(path, format="auto")` -> typed records (`records`),
- `tokenize.ChatTokenizer.from_dir(dir).tokenize(record, num_rejects)` -> `TokenizedGroup`,
- `packing.pack_batches(groups, buckets, batch_rows, group_size, pad_id, eos_id)` -> batches (design.md),
- `pipeline.make_train_iterator(data, tokenizer, stage=..., max_length=..., batch_size=...)` -> resumable
  iterator of packed batches,
- `synthetic.write_training_files` / `synthetic.write_long_rewardbench`, `tiny_tokenizer.TINY_TOKENIZER_DIR`,
- `python -m longrm_jax.data.inspect_data --data PATH --tokenizer DIR`.
"""
