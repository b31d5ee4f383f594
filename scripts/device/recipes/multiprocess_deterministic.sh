# multiprocess_node's comparison in fp32 with XLA's deterministic ops (N=4, or N=2 on 2 GPUs).
# Machine: 4 GPUs of one host (kind nvidia-h100-x4), or 2 with N=2 (kind nvidia-h100-x2). multiprocess_node's
# comparison made deterministic: one process driving N GPUs against `python -m longrm_jax.launch -n N train` (one
# GPU per process), 3 steps, fp32 compute (the XLA attention) and XLA's deterministic ops, so any difference left is
# the launch's, not GPU rounding noise (multiprocess_node, bf16 compute: steps 1-2 equal, later steps within the
# 1.5e-3 that two runs of one launch differ by). N (default 4). Outputs in $OUT: multiprocess_deterministic.tgz (both
# runs' logs and metrics.jsonl, summary.txt with compare_losses.py's per-step differences).
source scripts/device/common.sh
OUTF=$OUT; W=/tmp/w; mkdir -p $W; N=${N:-4}
export XLA_FLAGS="--xla_gpu_deterministic_ops=true"
SETS=(--set model.init=null --set model.preset=qwen3_8b --set model.overrides.num_layers=4 --set model.param_dtype=float32
      --set model.compute_dtype=float32 --set data.source=synthetic --set data.eval_source=null --set data.tokenizer=null
      --set data.layout=rows --set data.seq_len=2048 --set data.batch_rows=$((2 * N)) --set grad_accum=1 --set data.num_buckets=1
      --set data.num_train=64 --set "data.synthetic={lengths: [1900]}" --set steps=3 --set log_every=1
      --set eval_before=false --set eval_after=false --set tensorboard=false --set progress=false --set mesh.data=$((N / 2))
      --set mesh.fsdp=2 --set mesh.seq=1 --set checkpoint.every=0 --set checkpoint.at_end=false --set model.remat=full
      --set optim.warmup_ratio=0 --set optim.lr=1e-4)
timeout -s KILL 110 python3 -m longrm_jax.train --config configs/qwen3_8b_grm_simpo.yaml "${SETS[@]}" \
  --set output_dir=/tmp/runs/fp1 > $W/fp1.log 2>&1; echo "fp1 rc=$?" | tee -a $W/summary.txt
timeout -s KILL 110 python3 -m longrm_jax.launch -n $N train --config configs/qwen3_8b_grm_simpo.yaml "${SETS[@]}" \
  --set output_dir=/tmp/runs/fp4 > $W/fp4.log 2>&1; echo "fp4 rc=$?" | tee -a $W/summary.txt
cp /tmp/runs/fp1/metrics.jsonl $W/fp1.metrics.jsonl; cp /tmp/runs/fp4/metrics.jsonl $W/fp4.metrics.jsonl
python3 scripts/device/compare_losses.py $W/fp1.metrics.jsonl $W/fp4.metrics.jsonl | tee -a $W/summary.txt
grep -h "grad_norm" $W/fp1.log $W/fp4.log | tail -6 | tee -a $W/summary.txt
tar czf $OUTF/multiprocess_deterministic.tgz -C $W .
