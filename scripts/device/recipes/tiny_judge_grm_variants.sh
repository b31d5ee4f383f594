# The tiny judge recipe's GRM half (SFT -> SimPO -> export -> evaluate --both-orders) in several variants at once on
# the lent machine's CPU cores, each from the carried needle LM (carry runs/tiny_lm: `bash scripts/tiny_judge.sh`'s
# first stage). VARIANTS: space-separated NAME:LR:SEED (default "shipped:3.0e-3:0 s1:3.0e-3:1 lr1e3:1.0e-3:0
# lr1e3s1:1.0e-3:1"); LR and SEED apply to the SFT stage (SimPO as shipped). CHAIN_S: each chain's limit (520).
# SFT_STEPS: the SFT's steps (default: the config's 800). SIMPO=0: evaluate the SFT's export, without SimPO.
source scripts/device/common.sh
export JAX_PLATFORMS=cpu CUDA_VISIBLE_DEVICES=""
DATA=data/tiny_judge
python3 -m longrm_jax.data.synthetic --out $DATA --judge --lengths 32,64,128 --num-train 8000 --num-eval 64 \
  --bench-per-task 20 --bench-bon-fraction 0 > $OUT/data.log 2>&1 || { echo "data failed"; exit 1; }
chain() {  # name lr seed
  local n=$1 lr=$2 seed=$3 t0=$(date +%s)
  local last=sft
  python3 -m longrm_jax.train --config configs/tiny_grm_sft.yaml --set output_dir=/tmp/v/$n/sft --set optim.lr=$lr \
    --set seed=$seed --set progress=false --set model.init=runs/tiny_lm/checkpoints \
    ${SFT_STEPS:+--set steps=$SFT_STEPS} > $OUT/$n.sft.log 2>&1 || return 1
  if [ "${SIMPO:-1}" != 0 ]; then
    last=simpo
    python3 -m longrm_jax.train --config configs/tiny_grm_simpo.yaml --set output_dir=/tmp/v/$n/simpo \
      --set progress=false --set model.init=/tmp/v/$n/sft/checkpoints > $OUT/$n.simpo.log 2>&1 || return 1
  fi
  python3 -m longrm_jax.export --checkpoint /tmp/v/$n/$last --out /tmp/v/$n/hf --overwrite > $OUT/$n.export.log 2>&1 \
    || return 1
  python3 -m longrm_jax.evaluate --model-path /tmp/v/$n/hf --data-path $DATA/long_rewardbench --save-path /tmp/v/$n/eval \
    --both-orders --dtype float32 --max-new-tokens 64 --overwrite --no-progress > $OUT/$n.eval.log 2>&1 || return 1
  echo "$n lr=$lr seed=$seed: $(( $(date +%s) - t0 )) s" >> $OUT/summary.txt
}
for v in ${VARIANTS:-shipped:3.0e-3:0 s1:3.0e-3:1 lr1e3:1.0e-3:0 lr1e3s1:1.0e-3:1}; do
  IFS=: read -r n lr seed <<< "$v"
  ( timeout "${CHAIN_S:-520}" bash -c "$(declare -f chain); OUT=$OUT DATA=$DATA SFT_STEPS=${SFT_STEPS:-} SIMPO=${SIMPO:-1} chain $n $lr $seed" \
      || echo "$n: failed or cut off" >> $OUT/summary.txt ) &
done
wait
cat $OUT/summary.txt
for f in $OUT/*.sft.log; do echo "$f: $(grep -h 'held-out' $f | tail -1)"; done
for f in $OUT/*.eval.log; do echo "$f"; grep -E "both.orders|unparsable" $f; done
