# The tiny judge's SFT then SimPO from needle LMs already trained on this warm machine (tiny_lm_variants_gpu's /tmp/v/LM$s), both judged while they train
# LM (default base), SEEDS (default "0 1 2 3 4"), SFT_STEPS (default 300), SIMPO_STEPS (default 200), SFT_SET /
# SIMPO_SET (extra --set overrides), STAGE_S (default 240 per stage). SimPO is judged every 50 steps, SFT at its end.
source scripts/device/common_min.sh
SEEDS=${SEEDS:-0 1 2 3 4}
LM=${LM:-base}
DATA=data/tiny_judge
export JAX_PLATFORMS=cuda PYTHON=python3
python3 -m longrm_jax.data.synthetic --out $DATA --judge --lengths 32,64,128 --num-train 8000 --num-eval 64 \
  --bench-per-task 20 --bench-bon-fraction 0 > $OUT/data.log 2>&1 || { echo "data failed"; exit 1; }
rm -rf /tmp/p; mkdir -p /tmp/p
export XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.9 / $(wc -w <<< "$SEEDS"), 3))")
for s in $SEEDS; do
  [ -d /tmp/v/$LM$s/checkpoints ] || { echo "no /tmp/v/$LM$s: run tiny_lm_variants_gpu first on this machine"; exit 2; }
  ( timeout ${STAGE_S:-240} python3 -m longrm_jax.train --config configs/tiny_grm_sft.yaml --set seed=$s \
      --set progress=false --set output_dir=/tmp/p/sft$s --set model.init=/tmp/v/$LM$s/checkpoints \
      --set steps=${SFT_STEPS:-300} --set checkpoint.every=0 --set judge.every=0 ${SFT_SET:-} > /tmp/p/sft$s.log 2>&1
    timeout ${STAGE_S:-240} python3 -m longrm_jax.train --config configs/tiny_grm_simpo.yaml --set seed=$s \
      --set progress=false --set output_dir=/tmp/p/simpo$s --set model.init=/tmp/p/sft$s/checkpoints \
      --set steps=${SIMPO_STEPS:-200} --set checkpoint.every=50 --set judge.every=50 --set log_every=25 \
      ${SIMPO_SET:-} > /tmp/p/simpo$s.log 2>&1 ) &
done
wait
for s in $SEEDS; do
  echo "seed $s: sft $(grep -h 'judge at step' /tmp/p/sft$s.log | sed -E 's/.*accuracy ([0-9.]+)%.*agreement ([0-9.na/]+), ([0-9]+) of.*/\1 (unparsable \3)/'); simpo $(grep -h '^step [0-9]*: held-out verdict\|judge at step' /tmp/p/simpo$s.log | sed -E 's/^(step|judge at step) ([0-9]+):? held-out verdict accuracy ([0-9.]+)% over both orders, agreement ([0-9.na/]+), ([0-9]+) of.*/\2:\3(\5)/' | tr '\n' ' '); logprob $(grep -h 'log-prob accuracy on held-out' /tmp/p/simpo$s.log | sed 's/.*pairs: //')"
done | tee $OUT/summary.txt
grep -h "wall time" /tmp/p/*.log | sed -E 's/.*wall time ([0-9.]+ s).*/\1/' | tr '\n' ' '
tail -3 /tmp/p/simpo0.log
