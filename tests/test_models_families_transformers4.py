"""Our exports of the issue-43 families under transformers 4.57 (a subprocess with ``PYTHONPATH=$LONGRM_TF4_PATH``,
as tests/test_hf_transformers4.py): 4.x reads ``rope_theta`` / ``rope_scaling`` / ``rope_local_base_freq`` /
``sliding_window_pattern`` where 5.x reads ``rope_parameters`` and ``layer_types``; the logits must agree with
transformers 5 on sequences longer than the sliding window."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import torch
import transformers

from longrm_jax import load_pretrained
from longrm_jax.hf.save import save_pretrained
from helpers.family_parity import make_model, rel_err

TF4_PATH = os.environ.get("LONGRM_TF4_PATH")
pytestmark = [
    pytest.mark.skipif(not TF4_PATH, reason="LONGRM_TF4_PATH is unset: no transformers 4.57 install to compare against"),
    pytest.mark.slow,  # a second torch + transformers import in a subprocess
]
COMMON = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
CASES = {
    "qwen2_window": lambda: ("Qwen2ForCausalLM", transformers.Qwen2Config(
        num_hidden_layers=2, use_sliding_window=True, sliding_window=8, max_window_layers=1, **COMMON)),
    "mistral_window": lambda: ("MistralForCausalLM", transformers.MistralConfig(
        num_hidden_layers=2, head_dim=16, sliding_window=8, **COMMON)),
    "gemma3": lambda: ("Gemma3ForCausalLM", transformers.Gemma3TextConfig(
        num_hidden_layers=7, head_dim=16, query_pre_attn_scalar=24, sliding_window=8, final_logit_softcapping=5.0,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}, **COMMON)),
}
TF4_SCRIPT = r"""
import json, sys
import torch, transformers
from transformers import AutoModelForCausalLM
out = {"version": transformers.__version__}
ids = torch.tensor(json.loads(sys.argv[2]))
for name in json.loads(sys.argv[3]):
    model, info = AutoModelForCausalLM.from_pretrained(sys.argv[1] + "/" + name, output_loading_info=True,
                                                       attn_implementation="eager")
    with torch.no_grad():
        out[name] = {"logits": model.eval()(ids).logits.numpy().tolist(),
                     "info": {k: sorted(map(str, v)) for k, v in info.items()}}
print(json.dumps(out))
"""


def test_exports_give_transformers_5_logits_under_4_57(tmp_path):
    ids = np.random.default_rng(0).integers(3, 256, (1, 40)).tolist()
    reference = {}
    for name, case in CASES.items():
        cls, config = case()
        ref = make_model(cls, config, tmp_path / "src" / name)
        save_pretrained(load_pretrained(tmp_path / "src" / name), tmp_path / name, progress=False)
        with torch.no_grad():
            reference[name] = ref(torch.tensor(ids)).logits.numpy()
    env = dict(os.environ, PYTHONPATH=TF4_PATH, TRANSFORMERS_OFFLINE="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", TF4_SCRIPT, str(tmp_path), json.dumps(ids), json.dumps(list(CASES))],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tf4 = json.loads(proc.stdout.strip().splitlines()[-1])
    assert tf4["version"].startswith("4.57"), tf4["version"]
    for name in CASES:
        old = tf4[name]
        assert not any(old["info"][k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), old["info"]
        # eager (4.57) vs sdpa (5.x) attention: float32 rounding apart
        assert rel_err(old["logits"], reference[name]) <= 1e-5, name
