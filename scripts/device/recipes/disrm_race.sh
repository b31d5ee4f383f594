# Issue 31's DisRM evaluation race, ours and the transformers peer (SAMPLES, default 280).
# Was call D (issue 31): the DisRM race at the realistic size (280 samples, contexts 1K-32K in equal shares),
# ours and the transformers peer in the same run on the same GPU; ours' own log (timestamps per phase) is kept.
# Run: SAMPLES=280 bash scripts/device/run.sh disrm_race
source scripts/device/common.sh
S=${SAMPLES:-280}
timeout ${LIMIT:-570} python3 scripts/bench_eval.py --benchmark --kinds disrm --samples $S --length-scale 0.25 \
  --workdir /tmp/bwd --benchmarks-md $OUT/bench.md > $OUT/disrm_race$S.log 2>&1
echo "rc=$?"
find /tmp/bwd -maxdepth 2 -name "*.log" -exec cp {} $OUT/ \;
find /tmp/bwd -name timings.json -exec cp {} $OUT/ours_timings.json \;
grep -v "^\s*$" $OUT/disrm_race$S.log | grep -vi warning | tail -12 | cut -c1-700
