# The reward server on one GPU: a random Llama-3.1-8B classifier (/score) and a random Qwen3-8B judge (/v1/chat/completions) under one-sample clients, against offline score / evaluate
# PARTS (default "disrm grm"): disrm = scripts/bench_serve.py --kind disrm --preset llama31_8b, CLIENTS (32)
# concurrent one-sample clients for DURATION seconds (60), ROWS (64) rows of TOKENS (8192) tokens; grm = --kind grm --preset
# qwen3_8b, judgements of NEW (512) tokens, prompts of GRM_TOKENS (4096). PART_S: each part's limit (280).
# Writes $OUT/summary.txt (each part's table) and $OUT/bench.md (the sections bench_serve.py appends).
source scripts/device/common.sh
T=${PART_S:-280}
for part in ${PARTS:-disrm grm}; do
  case $part in
    disrm) args=(--kind disrm --preset llama31_8b --tokens ${TOKENS:-8192}) ;;
    grm) args=(--kind grm --preset qwen3_8b --tokens ${GRM_TOKENS:-4096} --max-new-tokens ${NEW:-512}) ;;
  esac
  echo "== $part" | tee -a $OUT/summary.txt
  timeout -s INT $T python3 scripts/bench_serve.py "${args[@]}" --clients ${CLIENTS:-32} --seconds ${DURATION:-60} \
    --rows ${ROWS:-64} --repeat 2 --benchmarks-md $OUT/bench.md > $OUT/$part.log 2>&1
  echo "rc=$?" >> $OUT/summary.txt
  grep -A2 "^| clients" $OUT/$part.log | tee -a $OUT/summary.txt
done
