#!/usr/bin/env bash
# The LongRM recipe end to end at toy scale, on the CPU, through the project's own CLIs: synthetic data -> a tiny
# needle-QA LM (the "pretrained" start) -> GRM stage 1 (SFT on judgements) -> GRM stage 2 (SimPO, from stage 1) ->
# export -> Long-RewardBench evaluation with --both-orders; then the DisRM (Bradley-Terry, from the same LM) beside
# it. Prints each step's wall time.
# README "A judge from scratch". Run from the repository root: `bash scripts/tiny_judge.sh` (it uses .venv;
# PYTHON=... picks another interpreter; arguments are ignored). Outputs: data/tiny_judge, runs/tiny_*, results/tiny_* (a re-run replaces them).
set -euo pipefail
cd "$(dirname "$0")/.."
# The interpreter: PYTHON if set, else the project's virtual environment (what scripts/quickstart.sh made; also
# from a fresh shell that has not activated it), else the python on PATH if it has the project installed.
VENV="${LONGRM_VENV:-.venv}"
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x "$VENV/bin/python" ]; then PY="$VENV/bin/python"
else PY=python
fi
if ! "$PY" -c "import longrm_jax, tokenizers" >/dev/null 2>&1; then
  echo "error: $PY cannot import the project (no $VENV here): run 'bash scripts/quickstart.sh' first, or set PYTHON" >&2
  exit 2
fi
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
step() {  # name, command...
  local name=$1 t0; shift
  t0=$(date +%s)
  echo "== $name: $*"
  "$@"
  echo "== $name: $(( $(date +%s) - t0 )) s (load average: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo n/a))"
}
DATA=data/tiny_judge
step data "$PY" -m longrm_jax.data.synthetic --out "$DATA" --judge --lengths 32,64,128 --num-train 8000 \
    --num-eval 64 --bench-per-task 20 --bench-bon-fraction 0
# The tiny "pretrained" LM both reward models start from (needle QA SFT), and its HF export for the DisRM.
step lm "$PY" -m longrm_jax.train --config configs/tiny_lm_needle.yaml
step lm_export "$PY" -m longrm_jax.export --checkpoint runs/tiny_lm --out runs/tiny_lm_hf --overwrite
step grm_sft "$PY" -m longrm_jax.train --config configs/tiny_grm_sft.yaml
step grm_simpo "$PY" -m longrm_jax.train --config configs/tiny_grm_simpo.yaml
step grm_export "$PY" -m longrm_jax.export --checkpoint runs/tiny_grm_simpo --out runs/tiny_grm_hf --overwrite
step grm_eval "$PY" -m longrm_jax.evaluate --model-path runs/tiny_grm_hf --data-path "$DATA/long_rewardbench" \
    --save-path results/tiny_grm --both-orders --dtype float32 --max-new-tokens 64 --overwrite
step disrm_bt "$PY" -m longrm_jax.train --config configs/tiny_disrm_bt.yaml
step disrm_export "$PY" -m longrm_jax.export --checkpoint runs/tiny_disrm_bt --out runs/tiny_disrm_hf --overwrite
step disrm_eval "$PY" -m longrm_jax.evaluate --model-path runs/tiny_disrm_hf --data-path "$DATA/long_rewardbench" \
    --save-path results/tiny_disrm --is-disrm --both-orders --dtype float32 --overwrite
echo "plots: results/tiny_grm/accuracy_by_length.png results/tiny_disrm/accuracy_by_length.png"
