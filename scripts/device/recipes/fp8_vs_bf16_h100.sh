# model.matmul_dtype=fp8 against the same run in bf16 through python -m longrm_jax.train, random weights, synthetic 2 x L pairs, rows layout
# RUNS (default "bt"): bt = the shipped Llama-3.1-8B BT LoRA config (configs/llama31_8b_disrm_bt.yaml, remat
# save_attention_out: what remat auto chose on an H100); simpo = Qwen3-8B full-parameter SimPO
# (configs/qwen3_8b_grm_simpo.yaml, bf16 weights, remat auto). L (default 32768), STEPS (default 10), RUN_S (each
# run's limit, default 270). Writes $OUT/summary.txt: each run's tokens/s, MFU and peak, and the per-step loss of
# fp8 against bf16 (scripts/device/compare_losses.py; its largest relative difference).
source scripts/device/common.sh
L=${L:-32768}
export STEPS=${STEPS:-10}
declare -A CFG=([bt]=configs/llama31_8b_disrm_bt.yaml [simpo]=configs/qwen3_8b_grm_simpo.yaml)
declare -A SETS=([bt]="--set model.remat=save_attention_out" [simpo]="--set model.param_dtype=bfloat16 --set model.remat=auto")
for r in ${RUNS:-bt}; do
  for m in compute fp8; do
    run_train ${r}_$m ${RUN_S:-270} ${CFG[$r]} $L ${SETS[$r]} --set model.matmul_dtype=$m
  done
  echo "== $r: fp8 against bf16, loss per step" | tee -a $OUT/summary.txt
  python3 scripts/device/compare_losses.py $OUT/${r}_compute.metrics.jsonl $OUT/${r}_fp8.metrics.jsonl --rtol 0.01 \
    2>&1 | tail -14 | tee -a $OUT/summary.txt
  for m in compute fp8; do
    python3 - $OUT/${r}_$m.metrics.jsonl $r $m <<'PY' | tee -a $OUT/summary.txt
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r.get("split") == "train" and r.get("tokens_per_s")]
last = rows[-3:]
mean = lambda k: sum(r[k] for r in last) / len(last) if last and all(r.get(k) is not None for r in last) else float("nan")
print(f"{sys.argv[2]} {sys.argv[3]}: mean of the last {len(last)} steps: {mean('tokens_per_s'):,.0f} tokens/s, "
      f"MFU {100 * mean('mfu'):.1f}%, step {mean('step_s'):.2f} s, peak {max((r.get('peak_gib') or 0) for r in rows):.1f} GiB")
PY
  done
done
