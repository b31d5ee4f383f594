# GRM evaluation of four 128K prompts in two slots, then the 128K decode benchmark at batch 2.
# Machine: one H100 80 GB. GRM evaluation of 128K-token prompts (four, one per task) through `python -m
# longrm_jax.evaluate` with a random Qwen3-8B, prompts prefilled straight into their slot (the evaluator plans 2
# slots of 128K on an H100), then, if under 420 s have passed, the decode benchmark at a 128K context, batch 2
# (static batch, rows prefilled one at a time), against the bandwidth bound. EVAL_TIMEOUT: the evaluation's limit
# (default 360 s). Outputs in $OUT: checkpoint.log, eval128k/ (timings.json) and eval128k.log, decode128k.log,
# bench_eval.md.
# Run: bash scripts/device/run.sh grm_eval_128k_slots
source scripts/device/common.sh
W=/tmp/h; mkdir -p $W
python3 - <<'PY' || { echo "data failed"; exit 1; }
from longrm_jax.data.synthetic import write_long_rewardbench
write_long_rewardbench("/tmp/h/data", per_task=1, seed=0, lengths=[130048], tasks=["LongQA", "Summ", "Code", "Math"],
                       bon_fraction=0)
PY
t0=$SECONDS
python3 scripts/bench_eval.py --benchmark --checkpoint-part qwen3_8b causal_lm $W/model > $OUT/checkpoint.log 2>&1 \
  || { tail -5 $OUT/checkpoint.log; exit 1; }
cp longrm_jax/assets/tiny_tokenizer/{tokenizer.json,tokenizer_config.json,special_tokens_map.json} $W/model/
echo "checkpoint written in $((SECONDS - t0)) s"
timeout ${EVAL_TIMEOUT:-360} python3 -m longrm_jax.evaluate --model-path $W/model --data-path $W/data \
  --save-path $OUT/eval128k --overwrite --no-progress --dtype bfloat16 --max-new-tokens 2048 \
  --simulate-judgement-lengths > $OUT/eval128k.log 2>&1; echo "evaluate rc=$?"
grep -iE "slot|estimate|bucket|out of memory|RESOURCE|Traceback|Error" $OUT/eval128k.log | cut -c1-300 | head -20
python3 -c "import json; t=json.load(open('$OUT/eval128k/timings.json')); print({k: v for k, v in t.items() if k != 'prompt_seconds'})" 2>&1 | tail -2
if (( SECONDS - t0 < 420 )); then
  timeout $((560 - (SECONDS - t0))) python3 scripts/bench_eval.py --preset qwen3_8b --lengths --no-peer --no-shared \
    --warmup 1 --decode-context 131072 --decode-steps 256 --decode-batch 2 --decode-prefill-rows 1 \
    --benchmarks-md $OUT/bench_eval.md > $OUT/decode128k.log 2>&1; echo "decode bench rc=$?"
  tail -8 $OUT/decode128k.log | cut -c1-300
fi
