# Needle LMs with and without the answer-checking rows, then the judge's SFT from each, seeds side by side on the lent GPU, judged while it trains
# LMS (default "needle check"): `needle` is configs/tiny_lm_needle.yaml as shipped, `check` the same with the
# verify_sft rows (one answer checked against the document) blended in; LM_SET adds --set overrides to both.
# SFTS (default "needle:plain check:plain"): LM:VARIANT pairs, VARIANT a name of the table below (--set overrides
# of configs/tiny_grm_sft.yaml), each judged every 100 steps. SEEDS (default "0 1 2 3 4"). BT=1: the DisRM of each
# `check` LM too (configs/tiny_disrm_bt.yaml) and its `evaluate --is-disrm --both-orders`. STAGE_S: each
# process's limit (default 300).
source scripts/device/common_min.sh
SEEDS=${SEEDS:-0 1 2 3 4}
LMS=${LMS:-needle check}
SFTS=${SFTS:-needle:plain check:plain}
DATA=data/tiny_judge
declare -A LM_SETS=([needle]="" [check]="--set data.sources=[$DATA/sft_train.jsonl,$DATA/verify_sft_train.jsonl]")
SFT_COMMON="--set steps=${SFT_STEPS:-600} --set checkpoint.every=100 --set judge.every=100"
declare -A SETS=([plain]="" [lr2e3]="--set optim.lr=2.0e-3")

export JAX_PLATFORMS=cuda PYTHON=python3
python3 -m longrm_jax.data.synthetic --out $DATA --judge --lengths 32,64,128 --num-train 8000 --num-eval 64 \
  --bench-per-task 20 --bench-bon-fraction 0 > $OUT/data.log 2>&1 || { echo "data failed"; exit 1; }
T=${STAGE_S:-300}
nlm=$(( $(wc -w <<< "$SEEDS") * $(wc -w <<< "$LMS") ))
export XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.9 / $nlm, 3))")
rm -rf /tmp/v
for s in $SEEDS; do for l in $LMS; do
  ( t0=$(date +%s)
    timeout $T python3 -m longrm_jax.train --config configs/tiny_lm_needle.yaml --set seed=$s --set progress=false \
      --set output_dir=/tmp/v/lm_$l$s ${LM_SETS[$l]} ${LM_SET:-} > $OUT/lm_$l$s.log 2>&1
    echo "lm $l seed $s: rc=$?, $(( $(date +%s) - t0 )) s" >> $OUT/summary.txt ) &
done; done
wait
n=$(( $(wc -w <<< "$SEEDS") * $(wc -w <<< "$SFTS") ))
[ -n "${BT:-}" ] && n=$(( n + $(wc -w <<< "$SEEDS") ))
export XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.9 / $n, 3))")
for s in $SEEDS; do for lv in $SFTS; do
  l=${lv%%:*}; v=${lv#*:}
  ( t0=$(date +%s)
    timeout $T python3 -m longrm_jax.train --config configs/tiny_grm_sft.yaml --set seed=$s --set progress=false \
      --set output_dir=/tmp/v/sft_${l}_$v$s --set model.init=/tmp/v/lm_$l$s/checkpoints $SFT_COMMON ${SETS[$v]} \
      > $OUT/sft_${l}_$v$s.log 2>&1
    echo "sft $l:$v seed $s: rc=$?, $(( $(date +%s) - t0 )) s" >> $OUT/summary.txt ) &
done; done
if [ -n "${BT:-}" ]; then for s in $SEEDS; do
  ( python3 -m longrm_jax.export --checkpoint /tmp/v/lm_check$s --out /tmp/v/lm_check$s.hf --overwrite > /dev/null 2>&1
    timeout $T python3 -m longrm_jax.train --config configs/tiny_disrm_bt.yaml --set seed=$s --set progress=false \
      --set output_dir=/tmp/v/bt$s --set model.init=/tmp/v/lm_check$s.hf > $OUT/bt$s.log 2>&1
    python3 -m longrm_jax.export --checkpoint /tmp/v/bt$s --out /tmp/v/bt$s.hf --overwrite > /dev/null 2>&1
    python3 -m longrm_jax.evaluate --model-path /tmp/v/bt$s.hf --data-path $DATA/long_rewardbench --is-disrm \
      --save-path /tmp/v/bt$s.eval --both-orders --dtype float32 --overwrite --no-progress > $OUT/bteval$s.log 2>&1
    echo "bt (check LM) seed $s: $(grep -h 'pairwise accuracy on held-out' $OUT/bt$s.log); evaluate: $(grep -h '^both_orders_accuracy' $OUT/bteval$s.log)" >> $OUT/summary.txt ) &
done; fi
wait
for s in $SEEDS; do for l in $LMS; do echo "lm $l seed $s: $(grep -h 'pairwise accuracy on held-out' $OUT/lm_$l$s.log)"; done; done >> $OUT/summary.txt
for s in $SEEDS; do for lv in $SFTS; do l=${lv%%:*}; v=${lv#*:}
  echo "$l:$v seed $s: $(grep -h '^step [0-9]*: held-out verdict' $OUT/sft_${l}_$v$s.log | sed -E 's/^step ([0-9]+): held-out verdict accuracy ([0-9.]+)% over both orders, agreement ([0-9.na/]+), ([0-9]+) of.*\(([0-9.]+) s\)/\1:\2(\4)/' | tr '\n' ' ')"
done; done >> $OUT/summary.txt
cat $OUT/summary.txt
