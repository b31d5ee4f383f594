# The tiny judge recipe at long contexts on the lent GPU: needle LM -> DisRM (BT) and judge SFT (held-out verdicts while it trains) on 1K-16K-token documents
# The shipped configs with data.seq_len=SEQ_LEN (default 32768: one row holds the longest judge prompt),
# data.batch_rows=ROWS (default 2) and rope_theta ROPE (default 500000, the tiny_llama preset's) on synthetic data of
# LENGTHS tokens (default "1024,4096,16384"; 4,000 training rows). SEEDS (default "0 1"), side by side; LM_STEPS
# (600), BT_STEPS (300), SFT_STEPS (800, judged every 200 on the 8-per-task benchmark, both orders). STAGE_S: each
# stage's limit (default 240). Writes $OUT/summary.txt: per seed and stage the held-out figures and seconds.
source scripts/device/common_min.sh
SEEDS=${SEEDS:-0 1}
T=${STAGE_S:-240}
L=${LENGTHS:-1024,4096,16384}
D=data/tiny_judge_long
n=$(wc -w <<< "$SEEDS")
export XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.9 / (2 * $n), 3))") JAX_PLATFORMS=cuda
python3 -m longrm_jax.data.synthetic --out $D --judge --lengths $L --num-train 4000 --num-eval 32 --bench-per-task 8 \
  --bench-bon-fraction 0 > $OUT/data.log 2>&1 || { echo "data failed"; tail $OUT/data.log; exit 1; }
LONG=(--set progress=false --set data.seq_len=${SEQ_LEN:-32768} --set data.batch_rows=${ROWS:-2}
      --set data.tokenizer=longrm_jax/assets/tiny_judge_tokenizer)
stage() {  # name seed config extra...
  local name=$1 s=$2 config=$3; shift 3
  local t0=$(date +%s)
  timeout $T python3 -m longrm_jax.train --config configs/$config --set seed=$s --set output_dir=/tmp/long/$name$s \
    "${LONG[@]}" "$@" > $OUT/$name$s.log 2>&1
  echo "$name seed $s: rc=$?, $(( $(date +%s) - t0 )) s" >> $OUT/stages.txt
}
for s in $SEEDS; do
  ( stage lm $s tiny_lm_needle.yaml --set steps=${LM_STEPS:-600} --set model.overrides.rope_theta=${ROPE:-500000} \
      --set data.source=$D/sft_train.jsonl --set data.eval_source=$D/eval.jsonl
    python3 -m longrm_jax.export --checkpoint /tmp/long/lm$s --out /tmp/long/lm_hf$s --overwrite > /dev/null 2>&1
    stage bt $s tiny_disrm_bt.yaml --set steps=${BT_STEPS:-300} --set model.init=/tmp/long/lm_hf$s \
      --set data.source=$D/disrm_train.jsonl --set data.eval_source=$D/disrm_eval.jsonl &
    stage sft $s tiny_grm_sft.yaml --set steps=${SFT_STEPS:-800} --set model.init=/tmp/long/lm$s/checkpoints \
      --set data.source=$D/judge_sft_train.jsonl --set data.eval_source=$D/judge_eval.jsonl \
      --set judge.data=$D/long_rewardbench --set judge.samples=8 --set checkpoint.every=200 --set judge.every=200
    wait ) &
done
wait
for s in $SEEDS; do
  echo "--- seed $s"
  grep -h "pairwise accuracy on held-out" $OUT/lm$s.log $OUT/bt$s.log
  grep -h "^step [0-9]*: held-out verdict\|log-prob accuracy on held-out\|tokens/s" $OUT/sft$s.log | tail -8
done >> $OUT/summary.txt
cat $OUT/stages.txt >> $OUT/summary.txt
cat $OUT/summary.txt
