# Evaluation on one GPU against one replica per GPU (--replicas auto), GRM and DisRM (KINDS).
# Machine: 4 GPUs of one host (kind nvidia-h100-x4). Evaluation on one GPU against one replica per GPU, the same
# prompts, the same machine. `python scripts/bench_eval.py --benchmark --no-peer` runs `python -m
# longrm_jax.evaluate` as a user would: with CUDA_VISIBLE_DEVICES=0 one process; with the 4 GPUs visible
# `--replicas auto` starts one replica per GPU. KINDS picks (default "grm disrm"); each kind runs 4 GPUs first,
# then one, while the call has time (BUDGET_S, default 560). GRM: 112 samples, contexts 1K-32K (--length-scale
# 0.25), judgements up to 512 tokens (eval_races_h200's GRM race); DisRM: 140 samples, --share-prompt.
# Outputs in $OUT: summary.txt and eval_replicas_node.tgz (each run's log, timings.json, replica logs, bench.md).
# Run: bash scripts/device/run.sh eval_replicas_node
source scripts/device/common.sh
OUTF=$OUT; W=/tmp/w; mkdir -p $W; OUT=$W
START=$(date +%s); BUDGET_S=${BUDGET_S:-560}
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
race() {  # race NAME GPUS NEED_S KIND bench args...
  local name=$1 gpus=$2 need=$3 kind=$4; shift 4
  if [ $(left) -lt $need ]; then echo "=== $name skipped: $(left) s left" | tee -a $W/summary.txt; return; fi
  echo "=== $name $(date -u +%T) CUDA_VISIBLE_DEVICES=$gpus python3 scripts/bench_eval.py --benchmark --no-peer --kinds $kind $*" | tee -a $W/summary.txt
  CUDA_VISIBLE_DEVICES=$gpus timeout $(left) python3 scripts/bench_eval.py --benchmark --no-peer --kinds $kind "$@" \
    --workdir /tmp/b$kind --benchmarks-md $W/bench.md > $W/$name.log 2>&1
  echo "rc=$?" | tee -a $W/summary.txt
  grep -E "^\| ours|replica|samples/h" $W/$name.log | tail -6 | cut -c1-400 | tee -a $W/summary.txt
  cp /tmp/b$kind/out-$kind/timings.json $W/$name.timings.json 2>/dev/null
  for r in /tmp/b$kind/out-$kind/replicas/r*; do [ -d $r ] && cp $r/evaluate.log $W/$name.$(basename $r).log; done
  tar czf $OUTF/eval_replicas_node.tgz -C $W .
}
GRM=(--samples 112 --length-scale 0.25 --max-new-tokens 512)
DISRM=(--samples 140 --length-scale 0.25)
for kind in ${KINDS:-grm disrm}; do
  case $kind in
    grm) race grm4 0,1,2,3 150 grm "${GRM[@]}"; race grm1 0 200 grm "${GRM[@]}" ;;
    disrm) race disrm4 0,1,2,3 110 disrm "${DISRM[@]}"; race disrm1 0 130 disrm "${DISRM[@]}" ;;
  esac
done
echo "=== total $(( $(date +%s) - START )) s" | tee -a $W/summary.txt; cp $W/summary.txt $OUTF/; tar czf $OUTF/eval_replicas_node.tgz -C $W .
