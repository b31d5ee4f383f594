# The tiny recipe's needle LM in variants x seeds side by side on the lent GPU, held-out accuracy every 25 steps (when retrieval forms)
# VARIANTS (default "base b4 b2 b4_lr5e3 check_b4"; the table below: --set overrides of
# configs/tiny_lm_needle.yaml), SEEDS (default "0 1 2 3 4"), LM_STEPS (default 600), STAGE_S (default 400).
# Writes $OUT/summary.txt: per run, the first step whose held-out accuracy is >= 95% and the last accuracy.
source scripts/device/common_min.sh
SEEDS=${SEEDS:-0 1 2 3 4}
VARIANTS=${VARIANTS:-base b4 b2 b4_lr5e3 check_b4}
DATA=data/tiny_judge
CHECK="--set data.sources=[$DATA/sft_train.jsonl,$DATA/verify_sft_train.jsonl]"
W128="--set model.overrides.hidden_size=128 --set model.overrides.intermediate_size=256 --set model.overrides.num_heads=8 --set model.overrides.num_kv_heads=4"
declare -A SETS=([base]="" [fp8]="--set model.matmul_dtype=fp8" [w128]="$W128" [b4]="--set data.batch_rows=4" [check]="$CHECK" [check_w128]="$CHECK $W128"
                 [lr5e3]="--set optim.lr=5.0e-3 --set optim.warmup_ratio=0.05" [b4_w128]="--set data.batch_rows=4 $W128" [b2]="--set data.batch_rows=2" [b4_lr5e3]="--set data.batch_rows=4 --set optim.lr=5.0e-3 --set optim.warmup_ratio=0.05" [check_b4]="$CHECK --set data.batch_rows=4")
export JAX_PLATFORMS=cuda PYTHON=python3
python3 -m longrm_jax.data.synthetic --out $DATA --judge --lengths 32,64,128 --num-train 8000 --num-eval 64 \
  --bench-per-task 20 --bench-bon-fraction 0 > $OUT/data.log 2>&1 || { echo "data failed"; exit 1; }
n=$(( $(wc -w <<< "$SEEDS") * $(wc -w <<< "$VARIANTS") ))
export XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.9 / $n, 3))")
rm -rf /tmp/v
for s in $SEEDS; do for v in $VARIANTS; do
  ( t0=$(date +%s)
    timeout ${STAGE_S:-400} python3 -m longrm_jax.train --config configs/tiny_lm_needle.yaml --set seed=$s \
      --set progress=false --set steps=${LM_STEPS:-600} --set eval_every=25 --set output_dir=/tmp/v/$v$s ${SETS[$v]} \
      > $OUT/lm_$v$s.log 2>&1
    echo "rc=$?, $(( $(date +%s) - t0 )) s" > /tmp/v/$v$s.rc ) &
done; done
wait
for v in $VARIANTS; do for s in $SEEDS; do
  python3 - $v $s /tmp/v/$v$s/metrics.jsonl "$(cat /tmp/v/$v$s.rc)" >> $OUT/summary.txt <<'PY'
import json, sys
v, s, path, rc = sys.argv[1:]
acc = [(r["step"], r["accuracy"]) for r in map(json.loads, open(path)) if r.get("split") == "eval"]
first = next((st for st, a in acc if a >= 0.95), None)
curve = " ".join(f"{a * 100:.0f}" for st, a in acc if st % 100 == 0)
print(f"{v} seed {s} ({rc}): >=95% from step {first}; last {acc[-1][1] * 100:.1f}%; every 100: {curve}")
PY
done; done
cat $OUT/summary.txt
