# The transformers peer of the GRM race on the buckets up to 24,576 tokens (SMOKE=1: tiny, on CPU).
# Machine: one H100 80 GB (SMOKE=1: the CPU). The transformers peer of the GRM race (`--benchmark --kinds grm
# --samples 112 --length-scale 0.25 --max-new-tokens 512`) on the buckets up to MAXLEN tokens (default 24576), with
# the slot plan ours makes for that race on an H100 (PLAN, fixed in the recipe). The 49,152-token bucket is left
# out; its peer time is in docs/benchmarks.md "The GRM race at 112 samples, peer measured per length bucket". Same
# data (seed 0) and random Qwen3-8B weights written by the bench's own helpers. LIMIT: the peer's time limit
# (default 480 s); NEW: tokens per judgement (default 512). Outputs in $OUT: peer.out and peer.err ([peer] lines:
# per-batch times).
# Run: bash scripts/device/run.sh grm_race_peer_buckets (SMOKE=1: tiny, CPU)
if [ -z "$SMOKE" ]; then source scripts/device/common.sh; PY=python3; else PY=python; OUT=${OUT:-/tmp/grm_race_peer_buckets}; mkdir -p $OUT; fi
W=/tmp/be; rm -rf $W; mkdir -p $W
$PY - <<PYEOF || exit 1
import argparse, sys, time
sys.path.insert(0, "scripts")
import bench_benchmark as bb
smoke = bool("$SMOKE")
a = argparse.Namespace(samples=112, length_scale=(1 / 256 if smoke else 0.25), smoke=smoke, scale=None,
                       max_new_tokens=512, grm_preset="qwen3_8b", disrm_preset="llama31_8b")
t = time.time(); print("lengths", bb.write_data(a, "$W/data"), flush=True)
bb.write_checkpoint(a, "$W/grm", "causal_lm"); print("checkpoint written in %.1f s" % (time.time() - t), flush=True)
PYEOF
PLAN='{"49152": 3, "24576": 11, "12288": 26, "6144": 32, "3072": 32, "2048": 32}'
MAXLEN=${MAXLEN:-24576}
timeout ${LIMIT:-480} $PY scripts/bench_eval.py --benchmark --peer-part grm --peer-model $W/grm --peer-data $W/data \
  --max-new-tokens ${NEW:-512} --peer-slot-plan "$PLAN" --peer-max-length $MAXLEN ${SMOKE:+--smoke} > $OUT/peer.out 2> $OUT/peer.err
echo "rc=$?"
grep "^\[peer\]" $OUT/peer.err | cut -c1-300
tail -3 $OUT/peer.out | cut -c1-600
