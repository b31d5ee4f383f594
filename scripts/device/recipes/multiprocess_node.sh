# One process per GPU (launch -n 4, SIGKILL, --resume, export) against one process; losses compared.
# Machine: 4 GPUs of one host (kind nvidia-h100-x4). One process per GPU, started as a cluster starts them, against
# one process driving the same four GPUs; then the ring step with the collective-overlap flags.
#   mp1     one process, 4 GPUs: Qwen3-8B shapes cut to 4 layers (random weights, fp32 master weights, bf16
#           compute), SimPO 4 pairs of 2 x 4K, mesh data 2 x fsdp 2, 6 steps;
#   mp4     the same through `python -m longrm_jax.launch -n 4 train` (JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
#           JAX_PROCESS_ID / JAX_LOCAL_DEVICE_IDS, one GPU per process), checkpoint every 3 steps, every process
#           SIGKILLed once step 4 is logged;
#   mp4r    `--resume` of mp4 to step 6; then `python -m longrm_jax.export` of its checkpoint (one HF directory);
#   ring4f  (if more than 260 s of BUDGET_S, default 540, are left) node_scaling's RUNS=ring4f: ring4 with the
#           overlap flags exported.
# The losses of mp1 and mp4 + mp4r are compared step by step (scripts/device/compare_losses.py). Outputs in $OUT:
# summary.txt, multiprocess_node.tgz (logs, metrics.jsonl, gpus.txt) and node_scaling's outputs for ring4f.
source scripts/device/common.sh
OUTF=$OUT; W=/tmp/w; mkdir -p $W; OUT=$W
START=$(date +%s)
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee $W/gpus.txt
SETS=(--set model.init=null --set model.preset=qwen3_8b --set model.overrides.num_layers=4 --set model.param_dtype=float32
      --set data.source=synthetic --set data.eval_source=null --set data.tokenizer=null --set data.layout=rows
      --set data.seq_len=4096 --set data.batch_rows=8 --set grad_accum=1 --set data.num_buckets=1 --set data.num_train=64
      --set "data.synthetic={lengths: [4000]}" --set steps=6 --set log_every=1 --set eval_before=false
      --set eval_after=false --set tensorboard=false --set progress=false --set mesh.data=2 --set mesh.fsdp=2
      --set mesh.seq=1 --set checkpoint.every=3 --set checkpoint.async_save=false --set model.remat=full)
T() { echo "$1 $(( $(date +%s) - START )) s" | tee -a $W/summary.txt; }
T "start"
timeout -s KILL 200 python3 -m longrm_jax.train --config configs/qwen3_8b_grm_simpo.yaml "${SETS[@]}" \
  --set output_dir=/tmp/runs/mp1 > $W/mp1.log 2>&1; echo "mp1 rc=$?" | tee -a $W/summary.txt; T "mp1 done"
cp /tmp/runs/mp1/metrics.jsonl $W/mp1.metrics.jsonl
# mp4: the launcher; every process killed (SIGKILL, as a node failure) once step 4 is in the log.
python3 -m longrm_jax.launch -n 4 train --config configs/qwen3_8b_grm_simpo.yaml "${SETS[@]}" \
  --set output_dir=/tmp/runs/mp4 > $W/mp4.log 2>&1 &
LAUNCHER=$!
for i in $(seq 1 200); do grep -q "step 4/6" $W/mp4.log && break; kill -0 $LAUNCHER 2>/dev/null || break; sleep 1; done
pkill -KILL -f "longrm_jax.train" ; kill -KILL $LAUNCHER 2>/dev/null; wait $LAUNCHER 2>/dev/null
echo "mp4 killed after: $(grep -o 'step [0-9]/6' $W/mp4.log | tail -1); checkpoints: $(ls /tmp/runs/mp4/checkpoints)" | tee -a $W/summary.txt
cp /tmp/runs/mp4/metrics.jsonl $W/mp4.metrics.jsonl; T "mp4 killed"
timeout -s KILL 200 python3 -m longrm_jax.launch -n 4 train --config configs/qwen3_8b_grm_simpo.yaml "${SETS[@]}" \
  --set output_dir=/tmp/runs/mp4 --resume > $W/mp4r.log 2>&1; echo "mp4r rc=$?" | tee -a $W/summary.txt; T "mp4r done"
cp /tmp/runs/mp4/metrics.jsonl $W/mp4r.metrics.jsonl
timeout -s KILL 120 python3 -m longrm_jax.export --checkpoint /tmp/runs/mp4/checkpoints --out /tmp/runs/mp4_hf \
  > $W/export.log 2>&1; echo "export rc=$? $(ls /tmp/runs/mp4_hf | tr '\n' ' ')" | tee -a $W/summary.txt; T "export done"
python3 scripts/device/compare_losses.py $W/mp1.metrics.jsonl $W/mp4r.metrics.jsonl | tee -a $W/summary.txt
tar czf $OUTF/multiprocess_node.tgz -C $W .
LEFT=$(( ${BUDGET_S:-540} - ($(date +%s) - START) ))
if [ $LEFT -gt 260 ]; then
  OUT=$OUTF RUNS=ring4f BUDGET_S=$LEFT bash scripts/device/run.sh node_scaling > $W/ring4f.txt 2>&1
  tail -5 $W/ring4f.txt | tee -a $W/summary.txt
fi
cp $W/summary.txt $OUTF/; tar czf $OUTF/multiprocess_node.tgz -C $W .; cat $W/summary.txt
