# The whole tiny judge recipe (scripts/tiny_judge.sh) for several seeds side by side on the lent GPU, with the judge's held-out verdicts while it trains
# SEEDS: space-separated seeds (default "0 1 2 3 4"); CHAIN_S: each chain's limit in seconds (default 540). Each chain
# is `SEED=s bash scripts/tiny_judge.sh` with JAX on the GPU (XLA_PYTHON_CLIENT_MEM_FRACTION split between them),
# its log in $OUT/seedS.log; summary.txt gathers per seed: the needle LM's held-out accuracy, the DisRM's and the
# judge's both-orders accuracy from evaluate, the judge's training-time verdicts (SFT's last step, SimPO's last step)
# beside its log-prob figure, and each stage's seconds.
source scripts/device/common_min.sh
SEEDS=${SEEDS:-0 1 2 3 4}
n=$(wc -w <<< "$SEEDS")
export XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.9 / $n, 3))") JAX_PLATFORMS=cuda PYTHON=python3
python3 -m longrm_jax.data.synthetic --out data/tiny_judge --judge --lengths 32,64,128 --num-train 8000 --num-eval 64 \
  --bench-per-task 20 --bench-bon-fraction 0 > $OUT/data.log 2>&1 || { echo "data failed"; exit 1; }
for s in $SEEDS; do
  ( t0=$(date +%s); SEED=$s timeout "${CHAIN_S:-540}" bash scripts/tiny_judge.sh > $OUT/seed$s.log 2>&1; rc=$?
    echo "seed $s: rc=$rc, $(( $(date +%s) - t0 )) s" >> $OUT/summary.txt ) &
  sleep 2
done
wait
for s in $SEEDS; do
  echo "--- seed $s"
  grep -E "^== [a-z_]+: [0-9]+ s" $OUT/seed$s.log | tr '\n' ' '; echo
  grep -E "pairwise accuracy on held-out|judge at step|judgement log-prob accuracy on|both_orders_accuracy|unparsable_verdicts" $OUT/seed$s.log
done >> $OUT/summary.txt
cat $OUT/summary.txt
