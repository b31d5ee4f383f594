# The tiny judge's chain (needle LM -> SFT -> SimPO) per model width x seed side by side on the lent GPU, each stage judged while it trains
# MODELS (default "base w128": the shipped tiny_llama 2-layer needle LM, or 128 wide with 8 heads), SEEDS (default
# "0 1 2 3 4"), LM_STEPS (600), SFTS (default "plain": SFT variants of the table below, each from every LM),
# SFT_STEPS (600, judged every 100), SIMPO_STEPS (150, judged every 50), SIMPO_SET (extra --set overrides of
# configs/tiny_grm_simpo.yaml), STAGE_S (each process's limit, default 240).
source scripts/device/common_min.sh
SEEDS=${SEEDS:-0 1 2 3 4}
MODELS=${MODELS:-base w128}
DATA=data/tiny_judge
W128="--set model.overrides.hidden_size=128 --set model.overrides.intermediate_size=256 --set model.overrides.num_heads=8 --set model.overrides.num_kv_heads=4"
declare -A SETS=([base]="" [w128]="$W128")
declare -A SFT_SETS=([plain]="" [wd]="--set optim.weight_decay=0.1" [lr3e3]="--set optim.lr=3.0e-3"
                     [wd_lr3e3]="--set optim.weight_decay=0.1 --set optim.lr=3.0e-3")
SFTS=${SFTS:-plain}
export JAX_PLATFORMS=cuda PYTHON=python3
python3 -m longrm_jax.data.synthetic --out $DATA --judge --lengths 32,64,128 --num-train 8000 --num-eval 64 \
  --bench-per-task 20 --bench-bon-fraction 0 > $OUT/data.log 2>&1 || { echo "data failed"; exit 1; }
rm -rf /tmp/c; mkdir -p /tmp/c
T=${STAGE_S:-240}
n_lm=$(( $(wc -w <<< "$SEEDS") * $(wc -w <<< "$MODELS") ))
export XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.9 / ($n_lm * $(wc -w <<< "$SFTS")), 3))")
for s in $SEEDS; do for m in $MODELS; do
  ( r=/tmp/c/$m$s
    timeout $T python3 -m longrm_jax.train --config configs/tiny_lm_needle.yaml --set seed=$s --set progress=false \
      --set output_dir=$r.lm --set steps=${LM_STEPS:-600} --set eval_every=50 ${SETS[$m]} > $r.lm.log 2>&1
    for v in $SFTS; do
      ( timeout $T python3 -m longrm_jax.train --config configs/tiny_grm_sft.yaml --set seed=$s --set progress=false \
          --set output_dir=$r.$v.sft --set model.init=$r.lm/checkpoints --set steps=${SFT_STEPS:-600} \
          --set checkpoint.every=100 --set judge.every=100 ${SFT_SETS[$v]} > $r.$v.sft.log 2>&1
        timeout $T python3 -m longrm_jax.train --config configs/tiny_grm_simpo.yaml --set seed=$s --set progress=false \
          --set output_dir=$r.$v.simpo --set model.init=$r.$v.sft/checkpoints --set steps=${SIMPO_STEPS:-150} \
          --set checkpoint.every=50 --set judge.every=50 --set log_every=25 ${SIMPO_SET:-} > $r.$v.simpo.log 2>&1 ) &
    done
    wait ) &
done; done
wait
verdicts() { grep -h '^step [0-9]*: held-out verdict\|^judge at step' "$1" | sed -E 's/^(step|judge at step) ([0-9]+):? held-out verdict accuracy ([0-9.]+)% over both orders, agreement ([0-9.na/]+), ([0-9]+) of.*/\2:\3(\5)/' | awk '!seen[$0]++' | tr '\n' ' '; }
for m in $MODELS; do for s in $SEEDS; do r=/tmp/c/$m$s
  echo "$m seed $s: lm $(grep -h 'pairwise accuracy on held-out' $r.lm.log | sed 's/.*pairs: //'), 95% from $(grep -h 'held-out pairwise accuracy at step' $r.lm.log | awk '$NF+0 >= 95 {print $6; exit}'), $(grep -h 'wall time' $r.lm.log | sed -E 's/.*wall time ([0-9.]+ s).*/\1/')"
  for v in $SFTS; do
    echo "  $v: sft $(verdicts $r.$v.sft.log)logprob $(grep -h 'log-prob accuracy on held-out' $r.$v.sft.log | sed 's/.*pairs: //'); simpo $(verdicts $r.$v.simpo.log)logprob $(grep -h 'log-prob accuracy on held-out' $r.$v.simpo.log | sed 's/.*pairs: //')"
  done
done; done | tee $OUT/summary.txt
