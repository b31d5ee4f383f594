"""Trained checkpoint (LoRA) -> python -m longrm_jax.export -> transformers loads it and gives the same scores."""

import jax
import numpy as np
import pytest

from longrm_jax import export as export_cli
from longrm_jax.train import DEFAULT_CONFIG
from longrm_jax.training import loop
from longrm_jax.training.lora import effective_params
from longrm_jax.training.model_setup import trained_model
from longrm_jax.training.config import load_config

TINY = ["data.seq_len=256", "data.batch_rows=2", "data.synthetic.lengths=[24,40]", "data.num_train=8",
        "steps=2", "eval_before=false", "eval_after=false", "tensorboard=false", "progress=false",
        "optim.lr=1e-2", "optim.warmup_ratio=0"]


# bt with LoRA: the merge at export is the training-specific part (CausalLM export parity is tested in tests/test_hf_*).
@pytest.mark.parametrize("stage", ["bt"])
def test_trained_checkpoint_exports_to_transformers(tmp_path, monkeypatch, stage):
    import torch
    import transformers

    extra = ["lora.rank=4", "lora.alpha=8"] if stage == "bt" else []
    cfg = load_config(None, TINY + extra + [f"stage={stage}", f"output_dir={tmp_path / 'run'}"], base=DEFAULT_CONFIG)
    result = loop.run(cfg)
    ckpt = result.checkpoint_dir
    # Trained (merged) weights are what the export loader sees.
    trained = jax.device_get(effective_params(result.state.params, result.state.frozen, alpha=cfg.lora.alpha,
                                                rank=cfg.lora.rank))
    model = trained_model(ckpt)
    from longrm_jax.training.params import ParamCodec

    exported = ParamCodec(model).values(model)
    for k, v in trained.items():
        np.testing.assert_allclose(np.asarray(exported[k]), v, rtol=1e-6, atol=1e-7, err_msg=k)
    if stage == "bt":
        assert np.abs(trained["model/layers/q_proj"] - result.state.frozen["model/layers/q_proj"]).max() > 0

    out = tmp_path / "hf"
    assert export_cli.main(["--checkpoint", str(tmp_path / "run"), "--out", str(out)]) == 0

    rng = np.random.default_rng(0)
    ids = rng.integers(10, 600, (2, 37)).astype(np.int32)
    if stage == "bt":
        hf = transformers.AutoModelForSequenceClassification.from_pretrained(out, torch_dtype=torch.float32)
        want = np.asarray(model(ids))
        with torch.no_grad():
            got = hf(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    else:
        hf = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
        want = np.asarray(model(ids))
        with torch.no_grad():
            got = hf(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

    # The exported HF directory starts a new run (model.init), with the trained weights.
    cfg2 = load_config(None, TINY + [f"stage={stage}", f"output_dir={tmp_path / 'again'}", f"model.init={out}",
                                     "steps=1"], base=DEFAULT_CONFIG)
    again = loop.run(cfg2)
    assert again.final_step == 1 and np.isfinite(again.last_metrics["loss"])
