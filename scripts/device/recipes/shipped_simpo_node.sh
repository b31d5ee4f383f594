# The shipped SimPO config (mesh: auto) on all GPUs and on GPU 0 alone, profiled (PARTS).
# Machine: 4 GPUs of one host (kind nvidia-h100-x4); it runs on any N GPUs of one host. The shipped SimPO config on
# the node beside one GPU of the same machine, as a user runs it: `python -m longrm_jax.train --config
# configs/qwen3_8b_grm_simpo.yaml` with synthetic pairs (random Qwen3-8B weights, no tokenizer, packed rows of
# 128,000 tokens, `mesh: auto`, the config's fp32 weights and moments) and only what a benchmark must change: 3 steps
# of one micro step each (grad_accum 1: a shipped step is 8 micro steps of ~25 s), no evaluation, no checkpoints,
# step 3 profiled.
#   shippedN  all N GPUs: mesh auto chooses (on four: the ring, seq=4, for one row per micro step) and prints why;
#   shipped1  GPU 0 alone (CUDA_VISIBLE_DEVICES=0): docs/training.md's one-GPU settings for 128K tokens of
#             full-parameter SimPO, `optim.offload_state=true` (the fp32 moments do not fit beside the rest) and
#             the remat settings of ONE_GPU_SETS; its limit ONE_GPU_S (default 300 s).
#   prevN     all GPUs again, with the package as it was before the ring skipped cross-sequence blocks (aa378ed^,
#             a copy in .prev/, git-excluded: `git archive aa378ed^ longrm_jax | tar x -C .prev`, carried with .whl):
#             the same-machine comparison for that change.
# On a machine of N GPUs the all-GPU parts are named shippedN / prevN (shipped4 / prev4 on four).
# PARTS picks (default "shippedN shipped1"); BUDGET_S (default 580) bounds the call. Everything lands in
# $OUT/shipped_simpo_node.tgz as it goes, summary.txt and the traces (NAME.xplane.pb.gz) beside it.
# GA (default 1): grad_accum, rows per optimizer step. With GA a multiple of the GPUs, mesh auto may give every
# GPU whole rows (data parallel, the step's rows re-split: parallel.mesh_choice) instead of the ring.
# STEPS (default 3) and PROFILE_AT (default 3): steps per run and the profiled step. ONE_GPU_SETS (default
# `--set model.remat=full --set model.mlp_chunk_tokens=8192`: what remat auto chooses for shipped1, given so no
# candidate compiles) replaces shipped1's remat settings; ONE_GPU_SETS="--set model.remat=auto" lets auto choose.
# Run: bash scripts/device/run.sh shipped_simpo_node
source scripts/device/common.sh
OUTF=$OUT; W=/tmp/wx; mkdir -p $W; START=$(date +%s); BUDGET_S=${BUDGET_S:-580}; PARTS=${PARTS:-"shippedN shipped1"}
N=$(nvidia-smi -L | wc -l)
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee $W/gpus.txt
SETS=(--set model.init=null --set model.preset=qwen3_8b --set data.source=synthetic --set data.eval_source=null
      --set data.tokenizer=null --set grad_accum=${GA:-1} --set data.num_train=64
      --set "data.synthetic={lengths: [20000, 60000]}" --set steps=${STEPS:-3} --set log_every=1 --set eval_before=false
      --set eval_after=false --set checkpoint.every=0 --set checkpoint.at_end=false --set tensorboard=false
      --set progress=false --set profile.start=${PROFILE_AT:-3} --set profile.steps=1)
ONE_GPU=(${ONE_GPU_SETS:---set model.remat=full --set model.mlp_chunk_tokens=8192})
one() {  # one NAME LIMIT_S [--set ...]
  local name=$1 t=$2; shift 2
  [ $(left) -lt $t ] && t=$(( $(left) - 5 ))
  if [ $t -lt 150 ]; then echo "=== $name skipped: $(left) s left" | tee -a $W/summary.txt; return; fi
  echo "=== $name $(date -u +%T) python3 -m longrm_jax.train --config configs/qwen3_8b_grm_simpo.yaml ${SETS[*]} $* --set output_dir=/tmp/runs/$name" | tee -a $W/summary.txt
  ( cd ${PKG_DIR:-.} && timeout $t python3 -m longrm_jax.train --config configs/qwen3_8b_grm_simpo.yaml "${SETS[@]}" "$@" \
    --set output_dir=/tmp/runs/$name > $W/$name.log 2>&1 )
  echo "rc=$?" | tee -a $W/summary.txt
  grep -iE "mesh|tokens_per_s|summary|predicted|refus|remat|error" $W/$name.log | cut -c1-300 | tail -14 | tee -a $W/summary.txt
  cp /tmp/runs/$name/metrics.jsonl $W/$name.metrics.jsonl 2>/dev/null; cp /tmp/runs/$name/memory_plan.json $W/$name.plan.json 2>/dev/null
  python3 scripts/profile_summary.py /tmp/runs/$name/profile --top 25 --json $W/$name.profile.json > $W/$name.profile.txt 2>&1
  grep -E "span|exposed" $W/$name.profile.txt | head -8 | tee -a $W/summary.txt
  find /tmp/runs/$name/profile -name "*.xplane.pb" -size -400M -exec gzip -c {} \; > $OUTF/$name.xplane.pb.gz 2>/dev/null
  tar czf $OUTF/shipped_simpo_node.tgz -C $W .
}
for p in $PARTS; do
  case $p in
    shippedN) one shipped$N 300 ;;
    prevN) ln -sfn ../configs .prev/configs; PKG_DIR=.prev one prev$N 300
           (cd .prev && python3 -c "import longrm_jax.ops.ring as r; print('prev ring', r.__file__, 'skips' if hasattr(r, 'segments_meet') else 'no skip')") | tee -a $W/summary.txt ;;
    shipped1) CUDA_VISIBLE_DEVICES=0 one shipped1 ${ONE_GPU_S:-300} "${ONE_GPU[@]}" --set optim.offload_state=true ;;
  esac
done
cp $W/summary.txt $OUTF/; tar czf $OUTF/shipped_simpo_node.tgz -C $W .; cat $W/summary.txt
