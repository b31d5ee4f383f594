# The tiny judge with look-up-by-password rows (data.synthetic's lookup_sft_train.jsonl) in the needle LM or in the judge's SFT, x seed, on the lent GPU
# Variants, each on SEEDS (default "0 1 2 3 4"), all side by side:
# - base: the shipped needle LM (LM_STEPS, default 500) -> the echo SFT;
# - lm: the needle LM with LOOKUP_ROWS (default 4000) look-up rows blended in, LM_LOOKUP_STEPS (default 800) -> SFT;
# - sft: the shipped needle LM -> the SFT with LOOKUP_ROWS look-up rows blended in.
# SFT_STEPS (default 800, judged every 100), STAGE_S (each process's limit, default 280). VARIANTS picks some
# (default "base lm sft"). Writes $OUT/summary.txt: per variant and seed, the LM's held-out pairs, the verdicts over
# both orders every 100 steps (step:accuracy(unparsable)), the held-out log-prob figure and each stage's wall time.
source scripts/device/common_min.sh
SEEDS=${SEEDS:-0 1 2 3 4}
VARIANTS=${VARIANTS:-base lm sft}
N=${LOOKUP_ROWS:-4000}
T=${STAGE_S:-280}
D=data/tiny_judge
export JAX_PLATFORMS=cuda PYTHON=python3
python3 -m longrm_jax.data.synthetic --out $D --judge --lengths 32,64,128 --num-train 8000 --num-eval 64 \
  --bench-per-task 20 --bench-bon-fraction 0 > $OUT/data.log 2>&1 || { echo "data failed"; cat $OUT/data.log; exit 1; }
rm -rf /tmp/y; mkdir -p /tmp/y
n_lm=0; for v in $VARIANTS; do [ $v = sft ] || n_lm=$((n_lm + 1)); done
export XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.9 / ($(wc -w <<< "$SEEDS") * $(wc -w <<< "$VARIANTS")), 3))")
lm() {  # name seed extra...
  local name=$1 s=$2; shift 2
  local t0=$(date +%s)
  timeout $T python3 -m longrm_jax.train --config configs/tiny_lm_needle.yaml --set seed=$s --set progress=false \
    --set output_dir=/tmp/y/lm_$name$s "$@" > /tmp/y/lm_$name$s.log 2>&1
  echo "$name seed $s: lm rc=$?, $(( $(date +%s) - t0 )) s" >> $OUT/stages.txt
}
sft() {  # variant lm_name seed extra...
  local v=$1 m=$2 s=$3; shift 3
  local t0=$(date +%s)
  timeout $T python3 -m longrm_jax.train --config configs/tiny_grm_sft.yaml --set seed=$s --set progress=false \
    --set output_dir=/tmp/y/$v$s --set model.init=/tmp/y/lm_$m$s/checkpoints --set steps=${SFT_STEPS:-800} \
    --set checkpoint.every=100 --set judge.every=100 "$@" > /tmp/y/$v$s.log 2>&1
  echo "$v seed $s: sft rc=$?, $(( $(date +%s) - t0 )) s" >> $OUT/stages.txt
}
LOOKUP="{path: $D/lookup_sft_train.jsonl, count: $N}"
for s in $SEEDS; do
  ( [[ " $VARIANTS " =~ " base " || " $VARIANTS " =~ " sft " ]] && lm base $s --set steps=${LM_STEPS:-500} &
    [[ " $VARIANTS " =~ " lm " ]] && lm lookup $s --set steps=${LM_LOOKUP_STEPS:-800} \
      --set "data.sources=[$D/sft_train.jsonl, $LOOKUP]" &
    wait
    [[ " $VARIANTS " =~ " base " ]] && sft base base $s &
    [[ " $VARIANTS " =~ " lm " ]] && sft lm lookup $s &
    [[ " $VARIANTS " =~ " sft " ]] && sft sft base $s --set "data.sources=[$D/judge_sft_train.jsonl, $LOOKUP]" &
    wait ) &
done
wait
verdicts() { grep -h '^step [0-9]*: held-out verdict\|^judge at step' "$1" | sed -E 's/^(step|judge at step) ([0-9]+):? held-out verdict accuracy ([0-9.]+)% over both orders, agreement ([0-9.na/]+), ([0-9]+) of.*/\2:\3(\5)/' | awk '!seen[$0]++' | tr '\n' ' '; }
for v in $VARIANTS; do for s in $SEEDS; do
  m=base; [ $v = lm ] && m=lookup
  echo "$v seed $s: lm $(grep -h 'pairwise accuracy on held-out' /tmp/y/lm_$m$s.log | sed 's/.*pairs: //' | tr '\n' ' ')| sft $(verdicts /tmp/y/$v$s.log)| logprob $(grep -h 'log-prob accuracy on held-out' /tmp/y/$v$s.log | tail -1 | sed 's/.*pairs: //')"
done; done | tee -a $OUT/summary.txt
cat $OUT/stages.txt
for f in /tmp/y/*.log; do grep -l "Traceback\|Error" $f; done | head -3 | while read f; do echo "== $f"; tail -5 $f; done
