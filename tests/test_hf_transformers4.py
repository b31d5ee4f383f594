"""Our exported checkpoints under transformers 4.57: same RoPE (inv_freq, attention scaling) and logits as 5.x.

transformers 4.x reads only ``rope_theta`` / ``rope_scaling`` (and silently uses theta 10000 without them),
5.x reads ``rope_parameters``; the export writes both. 4.57 runs in a subprocess with
``PYTHONPATH=$LONGRM_TF4_PATH``, a directory holding transformers 4.57 and the tokenizers / huggingface_hub
versions it needs, e.g.:

    pip install --target "$LONGRM_TF4_PATH" --no-deps "transformers==4.57.*" "tokenizers>=0.22,<=0.23.0" \
        "huggingface_hub>=0.34,<1.0"
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import torch  # the test extra installs it: a broken install fails the run, never skips
import transformers  # the test extra installs it: a broken install fails the run, never skips

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from longrm_jax.hf.save import save_pretrained  # noqa: E402
from longrm_jax.models import ModelConfig, build_model  # noqa: E402

TF4_PATH = os.environ.get("LONGRM_TF4_PATH")
pytestmark = [
    pytest.mark.skipif(not TF4_PATH, reason="LONGRM_TF4_PATH is unset: no transformers 4.57 install to compare against"),
    pytest.mark.slow,  # a second torch + transformers import in a subprocess
]

ROPE_CASES = {
    "llama_default": ("llama", "default", {}),
    "llama_linear": ("llama", "linear", {"factor": 2.0}),
    "llama_llama3": ("llama", "llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 32}),
    # max_position / original = 2, configured factor 4: 4.51-4.55 would have used 2.
    "qwen3_yarn": ("qwen3", "yarn", {"factor": 4.0, "original_max_position_embeddings": 64}),
}

TF4_SCRIPT = r"""
import json, sys
import numpy as np, torch, transformers
from transformers import AutoModelForCausalLM
out = {"version": transformers.__version__}
ids = torch.tensor(json.loads(sys.argv[2]))
for name in json.loads(sys.argv[3]):
    model, info = AutoModelForCausalLM.from_pretrained(sys.argv[1] + "/" + name, output_loading_info=True)
    model.eval()
    with torch.no_grad():
        logits = model(ids).logits.numpy()
    rot = model.model.rotary_emb
    out[name] = {"inv_freq": rot.inv_freq.tolist(), "scaling": float(rot.attention_scaling),
                 "logits": logits.tolist(), "info": {k: sorted(map(str, v)) for k, v in info.items()}}
print(json.dumps(out))
"""


def test_exported_config_gives_same_rope_under_transformers_4_57_and_5(tmp_path):
    ids = np.random.default_rng(0).integers(3, 256, (1, 100)).tolist()  # past original_max_position_embeddings
    ours = {}
    for name, (family, rope_type, scaling) in ROPE_CASES.items():
        cfg = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                          num_kv_heads=2, head_dim=24 if family == "qwen3" else 16, family=family,
                          qk_norm=family == "qwen3", rope_type=rope_type, rope_theta=50000.0, rope_scaling=scaling,
                          max_position_embeddings=128, initializer_range=0.2, bos_token_id=1, eos_token_id=2)
        model = build_model(cfg, rngs=nnx.Rngs(0))
        save_pretrained(model, tmp_path / name, progress=False)
        ours[name] = np.asarray(model(jnp.asarray(ids, jnp.int32)))

    env = dict(os.environ, PYTHONPATH=TF4_PATH, TRANSFORMERS_OFFLINE="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-c", TF4_SCRIPT, str(tmp_path), json.dumps(ids), json.dumps(list(ROPE_CASES))],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    tf4 = json.loads(proc.stdout.strip().splitlines()[-1])
    assert tf4["version"].startswith("4.57"), tf4["version"]

    for name in ROPE_CASES:
        model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / name).eval()
        rot = model.model.rotary_emb
        old = tf4[name]
        assert not any(old["info"][k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), old["info"]
        np.testing.assert_array_equal(np.asarray(old["inv_freq"], np.float32), rot.inv_freq.numpy(), err_msg=name)
        assert old["scaling"] == pytest.approx(float(rot.attention_scaling), rel=1e-7), name
        with torch.no_grad():
            new_logits = model(torch.tensor(ids)).logits.numpy()
        np.testing.assert_allclose(np.asarray(old["logits"]), new_logits, rtol=1e-5, atol=1e-5, err_msg=name)
        rel = np.linalg.norm(ours[name] - new_logits) / np.linalg.norm(new_logits)
        assert rel <= 1e-4, (name, rel)
