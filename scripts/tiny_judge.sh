#!/usr/bin/env bash
# The LongRM recipe end to end at toy scale, on the CPU, through the project's own CLIs: synthetic data -> a tiny
# needle-QA LM (the "pretrained" start) -> the DisRM (Bradley-Terry, from the LM's export) -> its Long-RewardBench
# evaluation with --both-orders; then the generative RM from the same LM: GRM stage 1 (SFT on judgements) -> GRM
# stage 2 (SimPO, from stage 1) -> export -> evaluation with --both-orders. Prints each step's wall time.
# README "A judge from scratch". Run from the repository root: `bash scripts/tiny_judge.sh` (it uses .venv;
# PYTHON=... picks another interpreter; arguments are ignored). Outputs: data/tiny_judge, runs/tiny_*, results/tiny_* (a re-run replaces them).
# SEED=N sets every training stage's seed (runs and results suffixed _seedN).
# FAMILY=gemma3 (or mistral, qwen2, qwen3; default llama: the shipped configs as they are) builds the needle LM from
# that family's tiny preset (tiny_$FAMILY in training.model_setup.PRESETS, as it is: model.overrides={}); every later
# stage starts from it as usual. Its runs and results go to runs/tiny_*_$FAMILY and results/tiny_*_$FAMILY.
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
FAMILY="${FAMILY:-llama}"
case "$FAMILY" in
  llama) S=""; LM_SET=() ;;
  gemma3|mistral|qwen2|qwen3) S="_$FAMILY"; LM_SET=(--set "model.preset=tiny_$FAMILY" --set "model.overrides={}") ;;
  *) echo "error: FAMILY=$FAMILY: one of llama, gemma3, mistral, qwen2, qwen3" >&2; exit 2 ;;
esac
# STEPS=fast: every stage shortened (needle LM 300 steps, DisRM 200, judge SFT 400, SimPO 30; the judge judged once,
# at its end) for models to try the API and the server with in a few minutes on a CPU: the DisRM reads the document,
# the judge answers in the judgement's format but decides near chance. Runs and results get the suffix _fast.
case "${STEPS:-full}" in
  full) LM_STEPS=(); BT_STEPS=(); SFT_STEPS=(); SIMPO_STEPS=() ;;
  fast) S="${S}_fast"; LM_STEPS=(--set steps=300); BT_STEPS=(--set steps=200)
        SFT_STEPS=(--set steps=400 --set judge.every=0 --set checkpoint.every=0); SIMPO_STEPS=(--set steps=30) ;;
  *) echo "error: STEPS=$STEPS: full (the default) or fast" >&2; exit 2 ;;
esac
# SEED=N: every training stage's seed (init, data order); its runs and results get the suffix _seedN. The data and
# the benchmark stay the same for every seed.
SEED_SET=()
if [ -n "${SEED:-}" ]; then
  case "$SEED" in ''|*[!0-9]*) echo "error: SEED=$SEED: a non-negative integer" >&2; exit 2 ;; esac
  S="${S}_seed$SEED"; SEED_SET=(--set "seed=$SEED")
fi
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
step lm "$PY" -m longrm_jax.train --config configs/tiny_lm_needle.yaml --set "output_dir=runs/tiny_lm$S" \
    ${LM_SET[@]+"${LM_SET[@]}"} ${SEED_SET[@]+"${SEED_SET[@]}"} ${LM_STEPS[@]+"${LM_STEPS[@]}"}
step lm_export "$PY" -m longrm_jax.export --checkpoint "runs/tiny_lm$S" --out "runs/tiny_lm_hf$S" --overwrite
step disrm_bt "$PY" -m longrm_jax.train --config configs/tiny_disrm_bt.yaml --set "output_dir=runs/tiny_disrm_bt$S" \
    --set "model.init=runs/tiny_lm_hf$S" ${SEED_SET[@]+"${SEED_SET[@]}"} ${BT_STEPS[@]+"${BT_STEPS[@]}"}
step disrm_export "$PY" -m longrm_jax.export --checkpoint "runs/tiny_disrm_bt$S" --out "runs/tiny_disrm_hf$S" \
    --overwrite
step disrm_eval "$PY" -m longrm_jax.evaluate --model-path "runs/tiny_disrm_hf$S" \
    --data-path "$DATA/long_rewardbench" --save-path "results/tiny_disrm$S" --is-disrm --both-orders \
    --dtype float32 --overwrite
step grm_sft "$PY" -m longrm_jax.train --config configs/tiny_grm_sft.yaml --set "output_dir=runs/tiny_grm_sft$S" \
    --set "model.init=runs/tiny_lm$S/checkpoints" ${SEED_SET[@]+"${SEED_SET[@]}"} ${SFT_STEPS[@]+"${SFT_STEPS[@]}"}
step grm_simpo "$PY" -m longrm_jax.train --config configs/tiny_grm_simpo.yaml \
    --set "output_dir=runs/tiny_grm_simpo$S" --set "model.init=runs/tiny_grm_sft$S/checkpoints" \
    ${SEED_SET[@]+"${SEED_SET[@]}"} ${SIMPO_STEPS[@]+"${SIMPO_STEPS[@]}"}
step grm_export "$PY" -m longrm_jax.export --checkpoint "runs/tiny_grm_simpo$S" --out "runs/tiny_grm_hf$S" --overwrite
step grm_eval "$PY" -m longrm_jax.evaluate --model-path "runs/tiny_grm_hf$S" --data-path "$DATA/long_rewardbench" \
    --save-path "results/tiny_grm$S" --both-orders --dtype float32 --max-new-tokens 64 --overwrite
echo "plots: results/tiny_grm$S/accuracy_by_length.png results/tiny_disrm$S/accuracy_by_length.png"
