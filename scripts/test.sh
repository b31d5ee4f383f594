#!/usr/bin/env bash
# From a fresh clone: find Python 3.12, create/reuse .venv, install the project with its test extra (pytest,
# torch, transformers 5.x, tokamax), put transformers 4.57 in a side folder for tests/test_hf_transformers4.py,
# put jax's CUDA plugin in another (GPU programs compiled without a GPU), and run the whole suite
# (`python -m pytest -n 2 tests`). Extra arguments replace `-n 2 tests`, e.g.
# `bash scripts/test.sh tests/test_training_config.py -x`. Safe to run again. This is what CI runs.
# --strict-skips: every dependency of the suite is installed here, so a skip whose reason is not in
# tests/allowed_skips.txt fails the run (tests/skip_policy.py).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh
setup_env "test"

# transformers 4.57 beside 5.x: the test that exported configs give the same RoPE under both runs it in a
# subprocess with PYTHONPATH=$LONGRM_TF4_PATH.
if [ -z "${LONGRM_TF4_PATH:-}" ]; then
  export LONGRM_TF4_PATH="$PWD/$VENV/tf457"
  if [ ! -f "$LONGRM_TF4_PATH/.complete" ]; then
    echo "installing transformers 4.57 into $LONGRM_TF4_PATH"
    "$VENV/bin/python" -m pip install -q --no-deps --target "$LONGRM_TF4_PATH" "transformers==4.57.*" \
      "tokenizers>=0.22,<=0.23.0" "huggingface-hub>=0.34,<1.0"
    touch "$LONGRM_TF4_PATH/.complete"
  fi
fi

# jax's CUDA plugin (no NVIDIA libraries, no GPU needed) beside the test environment: the tests that compile
# training steps for GPU topologies (tests/test_gpu_collective_overlap.py) run it in a subprocess with
# PYTHONPATH=$LONGRM_CUDA_COMPILE_PATH, so the suite's own jax stays CPU-only.
if [ -z "${LONGRM_CUDA_COMPILE_PATH:-}" ]; then
  export LONGRM_CUDA_COMPILE_PATH="$PWD/$VENV/cuda_compile"
  if [ ! -f "$LONGRM_CUDA_COMPILE_PATH/.complete" ]; then
    echo "installing jax's CUDA plugin (compile only) into $LONGRM_CUDA_COMPILE_PATH"
    "$VENV/bin/python" -m pip install -q --no-deps --target "$LONGRM_CUDA_COMPILE_PATH" \
      "jax-cuda13-plugin==$("$VENV/bin/python" -c 'import jax; print(jax.__version__)')" \
      "jax-cuda13-pjrt==$("$VENV/bin/python" -c 'import jax; print(jax.__version__)')"
    touch "$LONGRM_CUDA_COMPILE_PATH/.complete"
  fi
fi

args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-n 2 tests)
exec "$VENV/bin/python" -m pytest --strict-skips "${args[@]}"
