# The tiny judge's SFT per judgement style (data.synthetic --judgement) x seed side by side on the lent GPU, from needle LMs trained in the same call
# STYLES (default "echo check"), SEEDS (default "0 1 2"), LM_STEPS (500, the shipped config), SFT_STEPS (600,
# judged every 100), STAGE_S (each process's limit, default 300). Writes $OUT/summary.txt: per style and seed, the
# verdicts over both orders every 100 steps (step:accuracy(unparsable)) and the held-out log-prob figure.
source scripts/device/common_min.sh
SEEDS=${SEEDS:-0 1 2}
STYLES=${STYLES:-echo check}
export JAX_PLATFORMS=cuda PYTHON=python3
for st in $STYLES; do
  python3 -m longrm_jax.data.synthetic --out data/tiny_judge_$st --judge --judgement $st --lengths 32,64,128 \
    --num-train 8000 --num-eval 64 --bench-per-task 20 --bench-bon-fraction 0 > $OUT/data.log 2>&1 \
    || { echo "data failed"; cat $OUT/data.log; exit 1; }
done
D0=data/tiny_judge_$(set -- $STYLES; echo $1)  # the needle LM's data and the benchmark: the same in every style
T=${STAGE_S:-300}
rm -rf /tmp/y; mkdir -p /tmp/y
export XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.9 / ($(wc -w <<< "$SEEDS") * $(wc -w <<< "$STYLES")), 3))")
for s in $SEEDS; do
  ( t0=$(date +%s)
    timeout $T python3 -m longrm_jax.train --config configs/tiny_lm_needle.yaml --set seed=$s --set progress=false \
      --set output_dir=/tmp/y/lm$s --set steps=${LM_STEPS:-500} --set data.source=$D0/sft_train.jsonl \
      --set data.eval_source=$D0/eval.jsonl > /tmp/y/lm$s.log 2>&1
    echo "lm seed $s: rc=$?, $(( $(date +%s) - t0 )) s" >> $OUT/summary.txt
    for st in $STYLES; do
      ( D=data/tiny_judge_$st
        timeout $T python3 -m longrm_jax.train --config configs/tiny_grm_sft.yaml --set seed=$s --set progress=false \
          --set output_dir=/tmp/y/$st$s --set model.init=/tmp/y/lm$s/checkpoints --set steps=${SFT_STEPS:-600} \
          --set data.source=$D/judge_sft_train.jsonl --set data.eval_source=$D/judge_eval.jsonl \
          --set judge.data=$D0/long_rewardbench --set checkpoint.every=100 --set judge.every=100 > /tmp/y/$st$s.log 2>&1
        echo "rc=$?" > /tmp/y/$st$s.rc ) &
    done
    wait ) &
done
wait
verdicts() { grep -h '^step [0-9]*: held-out verdict\|^judge at step' "$1" | sed -E 's/^(step|judge at step) ([0-9]+):? held-out verdict accuracy ([0-9.]+)% over both orders, agreement ([0-9.na/]+), ([0-9]+) of.*/\2:\3(\5)/' | awk '!seen[$0]++' | tr '\n' ' '; }
for st in $STYLES; do for s in $SEEDS; do
  echo "$st seed $s ($(cat /tmp/y/$st$s.rc 2>/dev/null)): lm $(grep -h 'pairwise accuracy on held-out' /tmp/y/lm$s.log | sed 's/.*pairs: //'); sft $(verdicts /tmp/y/$st$s.log)logprob $(grep -h 'log-prob accuracy on held-out' /tmp/y/$st$s.log | sed 's/.*pairs: //'); $(grep -h 'wall time' /tmp/y/$st$s.log | sed -E 's/.*wall time ([0-9.]+ s).*/\1/')"
done; done | tee -a $OUT/summary.txt
tail -5 /tmp/y/$(set -- $STYLES; echo $2)0.log
