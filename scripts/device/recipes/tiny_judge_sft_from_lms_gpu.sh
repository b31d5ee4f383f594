# The tiny judge's SFT in variants from needle LMs already trained on this warm machine (tiny_lm_variants_gpu's /tmp/v/LM$s), judged every 100 steps
# LM (default base): which of tiny_lm_variants_gpu's LMs to start from; SEEDS (default "0 1 2 3 4"); VARIANTS
# (default "plain blend blend_b4"; the table below: --set overrides of configs/tiny_grm_sft.yaml); SFT_STEPS
# (default 600); STAGE_S (default 300). Writes $OUT/summary.txt: each run's verdicts over both orders per 100 steps.
source scripts/device/common_min.sh
SEEDS=${SEEDS:-0 1 2 3 4}
VARIANTS=${VARIANTS:-plain blend blend_b4}
LM=${LM:-base}
DATA=data/tiny_judge
BLEND="--set data.sources=[$DATA/judge_sft_train.jsonl,$DATA/verify_sft_train.jsonl]"
declare -A SETS=([plain]="" [blend]="$BLEND" [blend_b4]="$BLEND --set data.batch_rows=4" [b4]="--set data.batch_rows=4"
                 [lr2e3]="--set optim.lr=2.0e-3" [blend_lr2e3]="$BLEND --set optim.lr=2.0e-3")
export JAX_PLATFORMS=cuda PYTHON=python3
[ -f $DATA/verify_sft_train.jsonl ] || python3 -m longrm_jax.data.synthetic --out $DATA --judge --lengths 32,64,128 \
  --num-train 8000 --num-eval 64 --bench-per-task 20 --bench-bon-fraction 0 > $OUT/data.log 2>&1
rm -rf /tmp/s; mkdir -p /tmp/s
n=$(( $(wc -w <<< "$SEEDS") * $(wc -w <<< "$VARIANTS") ))
export XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.9 / $n, 3))")
for s in $SEEDS; do for v in $VARIANTS; do
  [ -d /tmp/v/$LM$s/checkpoints ] || { echo "no /tmp/v/$LM$s: run tiny_lm_variants_gpu first on this machine"; exit 2; }
  ( timeout ${STAGE_S:-300} python3 -m longrm_jax.train --config configs/tiny_grm_sft.yaml --set seed=$s \
      --set progress=false --set output_dir=/tmp/s/$v$s --set model.init=/tmp/v/$LM$s/checkpoints \
      --set steps=${SFT_STEPS:-600} --set checkpoint.every=100 --set judge.every=100 ${SETS[$v]} > /tmp/s/sft_$v$s.log 2>&1
    echo "rc=$?" > /tmp/s/$v$s.rc ) &
done; done
wait
for v in $VARIANTS; do for s in $SEEDS; do
  echo "$v seed $s ($(cat /tmp/s/$v$s.rc 2>/dev/null)): $(grep -h '^step [0-9]*: held-out verdict' /tmp/s/sft_$v$s.log | sed -E 's/^step ([0-9]+): held-out verdict accuracy ([0-9.]+)% over both orders, agreement ([0-9.na/]+), ([0-9]+) of.*/\1:\2(\4)/' | tr '\n' ' ')"
done; done > $OUT/summary.txt
grep -h "wall time" /tmp/s/sft_*.log | sed -E 's/.*wall time ([0-9.]+ s).*/\1/' | tr '\n' ' ' >> $OUT/summary.txt
cat $OUT/summary.txt
