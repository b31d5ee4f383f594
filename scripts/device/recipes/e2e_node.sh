# scripts/e2e_gpu.py on DEVICES GPUs (default 4): HF in, train, SIGKILL, --resume, export, evaluate.
# Machine: 4 GPUs of one host (kind nvidia-h100-x4); DEVICES=2 runs it on 2 GPUs of one host.
# The user's commands on the node: HF checkpoint (random Qwen3-8B in /dev/shm) -> python -m longrm_jax.train with
# the shipped SimPO config, one 2 x L pair per step over mesh.seq=4 (ring attention; L=65536: 131,072 tokens a
# step, the shipped rows' size), a checkpoint every step, SIGKILL after the first -> --resume -> python -m
# longrm_jax.export -> python -m longrm_jax.evaluate with --replicas 4 (one per GPU). The persistent compilation
# cache (compilation_cache) lets the resumed process reuse the killed one's compiled step.
# Settings: L (default 65536), DEVICES (default 4), EVAL_SAMPLES (default 2), E2E_S (the chain's limit, default
# 580 s), W (work folder, default /tmp/e2e_x4; W=/dev/shm/e2e puts the training checkpoints in RAM: the lent
# machines' disks write ~0.85 GB/s, ~55 s per 48 GB save). At the defaults on 4 x H100 the chain reaches its
# evaluation only after ~530 s; L=32768 EVAL_SAMPLES=1 gives a shorter chain.
# Outputs in $OUT: summary.txt (command, rc, most host RAM used, step lines), e2e.log (as it goes),
# benchmarks_section.md (phase table), e2e_x4.mon (memory every 5 s) and e2e_node.tgz (logs, phases.json,
# metrics.jsonl, memory_plan.json, eval results).
# Run: bash scripts/device/run.sh e2e_node   (L=32768 EVAL_SAMPLES=1 for a shorter chain)
source scripts/device/common.sh
W=${W:-/tmp/e2e_x4}; L=${L:-65536}; DEVICES=${DEVICES:-4}
( while sleep 5; do echo "$(date -u +%T) host_used_GiB=$(free -g | awk '/Mem:/{print $3}') gpu=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader | tr '\n' ' ')"; done ) > $OUT/e2e_x4.mon &
MON=$!
ARGS=(--model qwen3_8b --devices $DEVICES --length $L --scratch /dev/shm --eval-samples ${EVAL_SAMPLES:-2} --set compilation_cache=/tmp/jaxcache)
echo "=== $(date -u +%T) python3 scripts/e2e_gpu.py ${ARGS[*]} --work $W --keep --benchmarks-md $OUT/benchmarks_section.md" | tee $OUT/summary.txt
timeout ${E2E_S:-580} python3 scripts/e2e_gpu.py "${ARGS[@]}" --work $W --keep --benchmarks-md $OUT/benchmarks_section.md 2>&1 | tee $OUT/e2e.log | tail -40
echo "rc=$?" | tee -a $OUT/summary.txt
kill $MON 2>/dev/null
awk -F'host_used_GiB=' '{split($2,a," "); if (a[1]+0>m) m=a[1]+0} END {print "max host used GiB (free -g):", m}' $OUT/e2e_x4.mon | tee -a $OUT/summary.txt
grep -hE "^step |tokens/s|MFU|resumed" $W/train.log $W/resume.log 2>/dev/null | cut -c1-300 | tee -a $OUT/summary.txt
tar czf $OUT/e2e_node.tgz -C $W --ignore-failed-read $(cd $W && ls *.log phases.json run/metrics.jsonl run/memory_plan.json eval/results.csv eval/*.json 2>/dev/null)
