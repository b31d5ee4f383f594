# The GRM and DisRM evaluation races (ours against the transformers peer) on one H200, one part per call (PART).
# Machine: one H200 (141 GB). PART (required) is disrm, grm or peer; each part fits one 10-minute call.
#   PART=disrm  the DisRM race, ours and the transformers peer in one process (SAMPLES, default 140: ours
#               ~95 s + peer ~150 s on an H200; 280 does not fit one call there).
#   PART=grm    ours alone on the GRM race (112 samples, contexts 1K-32K, judgements up to 512 tokens: the race of
#               docs/benchmarks.md "The GRM race at 112 samples, peer measured per length bucket"); prints ours'
#               slot plan as PLAN=... for the peer parts.
#   PART=peer   the transformers peer on the buckets MINLEN..MAXLEN of the same data (seed 0: the same prompts),
#               with ours' slot plan PLAN (JSON: bucket -> rows), e.g.
#               PART=peer PLAN='{"49152": 6, ...}' MINLEN=49152 bash scripts/device/run.sh eval_races_h200
# LIMIT: the part's time limit (default 560 s for disrm and grm, 500 s for peer). Outputs in $OUT: bench.md,
# disrm_race$SAMPLES.log or grm_ours.log and ours_timings.json (disrm, grm); peer.out and peer.err (peer).
# The peer's per-batch times are printed ([peer] lines); buckets left out are named, to be run in another call.
source scripts/device/common.sh
PART=${PART:?PART=disrm, grm or peer}
case $PART in
disrm)
  S=${SAMPLES:-140}
  timeout ${LIMIT:-560} python3 scripts/bench_eval.py --benchmark --kinds disrm --samples $S --length-scale 0.25 \
    --workdir /tmp/bwd --benchmarks-md $OUT/bench.md > $OUT/disrm_race$S.log 2>&1
  echo "rc=$?"
  find /tmp/bwd -name timings.json -exec cp {} $OUT/ours_timings.json \;
  grep -v "^\s*$" $OUT/disrm_race$S.log | grep -vi warning | tail -14 | cut -c1-700
  ;;
grm)
  timeout ${LIMIT:-560} python3 scripts/bench_eval.py --benchmark --kinds grm --samples 112 --length-scale 0.25 \
    --max-new-tokens 512 --no-peer --workdir /tmp/bwg --benchmarks-md $OUT/bench.md > $OUT/grm_ours.log 2>&1
  echo "rc=$?"
  find /tmp/bwg -name timings.json -exec cp {} $OUT/ours_timings.json \;
  grep -iE "slot|estimate|samples/h|prefill|decode|wall" $OUT/grm_ours.log | tail -24 | cut -c1-300
  python3 -c "import json; t=json.load(open('$OUT/ours_timings.json')); print('PLAN=' + json.dumps(t.get('slot_plan', {})))"
  ;;
peer)
  W=/tmp/bk; rm -rf $W; mkdir -p $W
  python3 - <<PYEOF || exit 1
import argparse, sys, time
sys.path.insert(0, "scripts")
import bench_benchmark as bb
a = argparse.Namespace(samples=112, length_scale=0.25, smoke=False, scale=None, max_new_tokens=512,
                       grm_preset="qwen3_8b", disrm_preset="llama31_8b")
t = time.time(); print("lengths", bb.write_data(a, "$W/data"), flush=True)
bb.write_checkpoint(a, "$W/grm", "causal_lm"); print("checkpoint written in %.1f s" % (time.time() - t), flush=True)
PYEOF
  timeout ${LIMIT:-500} python3 scripts/bench_eval.py --benchmark --peer-part grm --peer-model $W/grm \
    --peer-data $W/data --max-new-tokens 512 --peer-slot-plan "${PLAN:?PLAN from PART=grm}" \
    ${MINLEN:+--peer-min-length $MINLEN} ${MAXLEN:+--peer-max-length $MAXLEN} > $OUT/peer.out 2> $OUT/peer.err
  echo "rc=$?"
  grep "^\[peer\]" $OUT/peer.err | cut -c1-300
  tail -3 $OUT/peer.out | cut -c1-600
  ;;
esac
