# The DisRM evaluation race on one H100: ours against the transformers peer (SAMPLES, default 280).
# Machine: one H100 80 GB.
# scripts/bench_eval.py --benchmark --kinds disrm: SAMPLES samples (default 280, the race's realistic size),
# contexts 1K-32K in equal shares (--length-scale 0.25), ours and the transformers peer in the same run on the same
# GPU; ours' own log (timestamps per phase) is kept. LIMIT: the run's time limit (default 570 s).
# Outputs in $OUT: disrm_race$SAMPLES.log, bench.md, the workdir's logs and ours_timings.json.
# Run: SAMPLES=280 bash scripts/device/run.sh disrm_race
source scripts/device/common.sh
S=${SAMPLES:-280}
timeout ${LIMIT:-570} python3 scripts/bench_eval.py --benchmark --kinds disrm --samples $S --length-scale 0.25 \
  --workdir /tmp/bwd --benchmarks-md $OUT/bench.md > $OUT/disrm_race$S.log 2>&1
echo "rc=$?"
find /tmp/bwd -maxdepth 2 -name "*.log" -exec cp {} $OUT/ \;
find /tmp/bwd -name timings.json -exec cp {} $OUT/ours_timings.json \;
grep -v "^\s*$" $OUT/disrm_race$S.log | grep -vi warning | tail -12 | cut -c1-700
