# The tiny judge's SFT stage in variants x seeds side by side on the lent GPU, each judged while it trains; the shipped variant's export also through evaluate
# SEEDS (default "0 1 4"): the needle LM of each seed is trained first (configs/tiny_lm_needle.yaml, seed s), then
# VARIANTS (default "shipped decay lr1e3"; NAME=--set overrides in the recipe's table below) of
# configs/tiny_grm_sft.yaml from it, all at once. The shipped variant's last step is exported and judged by
# `evaluate --both-orders --limit 20` twice, with and without the GPU decode flags (--no-gpu-flags), beside the
# training-time verdicts of that step. STAGE_S: each process's limit (default 420). BT="--set k=v ...": also the
# DisRM of each seed (configs/tiny_disrm_bt.yaml from the LM's export, with those overrides) and its
# `evaluate --is-disrm --both-orders`.
source scripts/device/common_min.sh
SEEDS=${SEEDS:-0 1 4}
VARIANTS=${VARIANTS:-shipped decay lr1e3}
declare -A SETS=([shipped]="" [decay]="--set optim.min_lr_ratio=0.1" [lr1e3]="--set optim.lr=1.0e-3"
                 [lr1e3decay]="--set optim.lr=1.0e-3 --set optim.min_lr_ratio=0.1"
                 [steps3k]="--set steps=3000" [decay3k]="--set steps=3000 --set optim.min_lr_ratio=0.05")
n=$(( $(wc -w <<< "$SEEDS") * $(wc -w <<< "$VARIANTS") ))
export JAX_PLATFORMS=cuda PYTHON=python3
DATA=data/tiny_judge
python3 -m longrm_jax.data.synthetic --out $DATA --judge --lengths 32,64,128 --num-train 8000 --num-eval 64 \
  --bench-per-task 20 --bench-bon-fraction 0 > $OUT/data.log 2>&1 || { echo "data failed"; exit 1; }
T=${STAGE_S:-420}
export XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.9 / $(wc -w <<< "$SEEDS"), 3))")
rm -rf /tmp/v  # a warm machine keeps /tmp: no run of an earlier call is reused
for s in $SEEDS; do
  timeout $T python3 -m longrm_jax.train --config configs/tiny_lm_needle.yaml --set seed=$s --set progress=false \
    --set output_dir=/tmp/v/lm$s > $OUT/lm$s.log 2>&1 &
done
wait
at_once=$n; [ -n "${BT:-}" ] && at_once=$(( n + $(wc -w <<< "$SEEDS") ))
export XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.9 / $at_once, 3))")
for s in $SEEDS; do for v in $VARIANTS; do
  ( t0=$(date +%s)
    timeout $T python3 -m longrm_jax.train --config configs/tiny_grm_sft.yaml --set seed=$s --set progress=false \
      --set output_dir=/tmp/v/$v$s --set model.init=/tmp/v/lm$s/checkpoints ${SETS[$v]} > $OUT/sft_$v$s.log 2>&1
    echo "sft $v seed $s: rc=$?, $(( $(date +%s) - t0 )) s" >> $OUT/summary.txt
    if [ "$v" = shipped ]; then
      python3 -m longrm_jax.export --checkpoint /tmp/v/$v$s --out /tmp/v/$v$s.hf --overwrite > /dev/null 2>&1
      for flags in gpu_flags no_gpu_flags; do
        extra=""; [ $flags = no_gpu_flags ] && extra=--no-gpu-flags
        python3 -m longrm_jax.evaluate --model-path /tmp/v/$v$s.hf --data-path $DATA/long_rewardbench \
          --save-path /tmp/v/$v$s.$flags --both-orders --limit 20 --max-new-tokens 64 --dtype float32 --overwrite \
          --no-progress $extra > $OUT/eval_$flags$s.log 2>&1
        python3 - /tmp/v/$v$s.$flags/predictions.jsonl /tmp/v/$v$s/judge/step_*/results/predictions.jsonl \
          >> $OUT/summary.txt <<'PY'
import json, sys, os
want = [json.loads(l) for l in open(sys.argv[1])]
steps = sorted(sys.argv[2:], key=lambda p: int(p.split("step_")[1].split("/")[0]))
got = [json.loads(l) for l in open(steps[-1])]
print(f"  {os.path.basename(os.path.dirname(sys.argv[1]))}: evaluate's predictions "
      f"{'EQUAL' if got == want else 'DIFFER'} to the training-time judge's of {steps[-1].split('/')[5]} "
      f"({sum(a != b for a, b in zip(got, want))} of {len(want)} differ)")
PY
      done
    fi ) &
done; done
if [ -n "${BT:-}" ]; then for s in $SEEDS; do
  ( python3 -m longrm_jax.export --checkpoint /tmp/v/lm$s --out /tmp/v/lm$s.hf --overwrite > /dev/null 2>&1
    timeout $T python3 -m longrm_jax.train --config configs/tiny_disrm_bt.yaml --set seed=$s --set progress=false \
      --set output_dir=/tmp/v/bt$s --set model.init=/tmp/v/lm$s.hf $BT > $OUT/bt$s.log 2>&1
    python3 -m longrm_jax.export --checkpoint /tmp/v/bt$s --out /tmp/v/bt$s.hf --overwrite > /dev/null 2>&1
    python3 -m longrm_jax.evaluate --model-path /tmp/v/bt$s.hf --data-path $DATA/long_rewardbench --is-disrm \
      --save-path /tmp/v/bt$s.eval --both-orders --dtype float32 --overwrite --no-progress > $OUT/bteval$s.log 2>&1
    echo "bt seed $s ($BT): $(grep -h 'pairwise accuracy on held-out' $OUT/bt$s.log); evaluate: $(grep -h '^both_orders_accuracy' $OUT/bteval$s.log)" >> $OUT/summary.txt ) &
done; fi
wait
for s in $SEEDS; do echo "lm seed $s: $(grep -h 'pairwise accuracy on held-out' $OUT/lm$s.log)"; done >> $OUT/summary.txt
for s in $SEEDS; do for v in $VARIANTS; do
  echo "$v seed $s: $(grep -h '^step [0-9]*: held-out verdict' $OUT/sft_$v$s.log | sed -E 's/held-out verdict accuracy ([0-9.]+)% over both orders, agreement ([0-9.na/]+), ([0-9]+) of.*\(([0-9.]+) s\)/\1 (\2, unparsable \3, \4 s)/' | tr '\n' ' ')"
done; done >> $OUT/summary.txt
grep -h both_orders_accuracy $OUT/eval_*.log >> $OUT/summary.txt
cat $OUT/summary.txt
