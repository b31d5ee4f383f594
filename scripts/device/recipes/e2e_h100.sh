# scripts/e2e_gpu.py on one H100 (HF in, train, SIGKILL, --resume, export, evaluate), PART=qwen or llama.
# Machine: one H100 80 GB (the GPU most users have). A new user's chain, one model per call (each takes most of a
# 10-minute call; limit 585 s): HF checkpoint -> python -m longrm_jax.train (SIGKILL after the first checkpoint)
# -> --resume -> python -m longrm_jax.export -> python -m longrm_jax.evaluate, 2 x 32K pairs, scratch in /dev/shm.
# PART=qwen (default): Qwen3-8B SimPO, full parameters, with the H100's full-parameter recipe (docs/training.md,
#   "Long pairs on one GPU": the moments in pinned host memory, so their checkpoint and restore run through that
#   placement too; saves of such steps are synchronous, as an asynchronous one beside the pinned state runs the
#   host out of RAM).
# PART=llama: Llama-3.1-8B BT with the shipped LoRA (bf16 base), remat full.
# Outputs in $OUT: summary.txt (command, rc, the most host RAM used), e2e.log, benchmarks_section.md (phase
# table), e2e_PART.mon (host and GPU memory every 5 s) and e2e_h100_PART.tgz (logs, phases.json, metrics.jsonl,
# memory_plan.json, eval/results.csv).
# Run: PART=qwen bash scripts/device/run.sh e2e_h100   (then PART=llama)
source scripts/device/common.sh
case ${PART:-qwen} in
  qwen) ARGS=(--model qwen3_8b --scratch /dev/shm --set model.remat=offload_layer_inputs --set model.mlp_chunk_tokens=8192
              --set optim.offload_state=true) ;;
  llama) ARGS=(--model llama31_8b --scratch /dev/shm --set model.remat=full) ;;
  *) echo "PART must be qwen or llama"; exit 2 ;;
esac
( while sleep 5; do echo "$(date -u +%T) host_used_GiB=$(free -g | awk '/Mem:/{print $3}') gpu=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"; done ) > $OUT/e2e_${PART:-qwen}.mon &
MON=$!
W=/tmp/e2e_${PART:-qwen}
echo "=== $(date -u +%T) python3 scripts/e2e_gpu.py ${ARGS[*]} --work $W --keep --benchmarks-md $OUT/benchmarks_section.md" | tee $OUT/summary.txt
timeout 585 python3 scripts/e2e_gpu.py "${ARGS[@]}" --work $W --keep --benchmarks-md $OUT/benchmarks_section.md 2>&1 | tee $OUT/e2e.log | tail -40
echo "rc=$?" | tee -a $OUT/summary.txt
kill $MON 2>/dev/null
awk -F'host_used_GiB=' '{split($2,a," "); if (a[1]+0>m) m=a[1]+0} END {print "max host used GiB (free -g):", m}' $OUT/e2e_${PART:-qwen}.mon | tee -a $OUT/summary.txt
# The device tool brings back a handful of files: everything else goes in one archive.
tar czf $OUT/e2e_h100_${PART:-qwen}.tgz -C $W --ignore-failed-read $(cd $W && ls *.log phases.json run/metrics.jsonl \
  run/memory_plan.json eval/results.csv 2>/dev/null)
