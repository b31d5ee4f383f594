# H200: Qwen3-8B BT 2 x 32K with the PyTorch peer (PART=bt), GRM evaluation at full contexts (PART=grm).
# Machine: one H200 (141 GB).
#   PART=bt   the "nothing got slower" check: Qwen3-8B BT 2 x 32K, full parameters, remat save_attention_out, ours
#             and the PyTorch peer (scripts/bench_train.py, 1 warm-up + 2 timed steps, limit 260 s). Expected: ours
#             at the 49.5% MFU of docs/benchmarks.md "Full 2 x 32K rows, with the peer".
#   PART=grm  the GRM evaluation at full context lengths (4K-128K, judgements up to 2,048 tokens) on SAMPLES samples
#             (default 21), ours only (scripts/bench_eval.py --no-peer), for the full-size extrapolation; GRM_TIMEOUT
#             (default 330 s) limits it.
# PART unset (default) runs bt, then grm. Outputs in $OUT: bench_train.md, bench_train.json, bench_train.log (bt);
# bench_eval.md, bench_eval.log and out-grm/ (grm).
# Run: bash scripts/device/run.sh bt32k_peer_grm_full_context  (PART=bt or PART=grm for one half)
source scripts/device/common.sh
PART=${PART:-both}
if [ "$PART" != grm ]; then
  timeout 260 python3 scripts/bench_train.py --models qwen3_8b --stages bt --lengths 32768 --devices 1 \
    --remat save_attention_out --full-params --warmup 1 --steps 2 --benchmarks-md $OUT/bench_train.md \
    --json $OUT/bench_train.json > $OUT/bench_train.log 2>&1; echo "bench_train rc=$?"
  tail -12 $OUT/bench_train.log
fi
if [ "$PART" != bt ]; then
  timeout ${GRM_TIMEOUT:-330} python3 scripts/bench_eval.py --benchmark --kinds grm --samples ${SAMPLES:-21} \
    --length-scale 1.0 --max-new-tokens 2048 --no-peer --workdir /tmp/bb --benchmarks-md $OUT/bench_eval.md \
    > $OUT/bench_eval.log 2>&1; echo "bench_eval rc=$?"
  grep -iE "slot|estimate|samples/h|prefill|decode|wall|bucket" $OUT/bench_eval.log | tail -30 | cut -c1-300
  find /tmp/bb -name "*.log" -newer $OUT/bench_train.log 2>/dev/null | head; cp -r /tmp/bb/out-grm $OUT/ 2>/dev/null
  tail -5 $OUT/bench_eval.log
fi
