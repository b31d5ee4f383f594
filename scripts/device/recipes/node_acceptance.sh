# 4-GPU acceptance points (PARTS): deterministic multi-process, ring4 with overlap defaults, peer16.
# Machine: 4 GPUs of one host (kind nvidia-h100-x4). Three of the node's acceptance points in one call, each under
# its own time limit within BUDGET_S (default 585 s), everything packed into $OUT/node_acceptance.tgz as it goes (a
# call cut off keeps what finished), summary.txt beside it. PARTS picks (default "mp ring4 peer16"):
#   mp      4 processes (python -m longrm_jax.launch -n 4 train, one GPU each) against one process driving the 4
#           GPUs, made deterministic (fp32 compute, XLA's deterministic ops, learning rate from step 1): Qwen3-8B
#           shapes cut to 4 layers, SimPO, 4 pairs of 2 x 2K a step, mesh data 2 x fsdp 2, 8 steps, a checkpoint
#           every 3. The 4 processes are SIGKILLed once step 4 is logged, resumed with --resume to step 8, and
#           exported. compare_losses.py compares the 1-process losses with the 4-process ones (killed + resumed).
#   ring4   node_scaling's ring4 (one 2 x 128K pair over mesh.seq=4) with the overlap defaults the trainer applies,
#           remat save_attention_out (auto's pick, without its candidate compiles).
#   peer16  fsdp2_peer_node's part 1 at 2 x 16K per GPU: ours mesh.fsdp=4 against PyTorch FSDP2 on the 4 GPUs (2 x 16K: the
#           peer's fp32 all-vocabulary logits do not fit at 2 x 32K).
# MP_LAYERS, MP_STEPS, MP_EVERY, MP_KILL (default 4, 8, 3, 4) and EXPORT=0 (skip the export) shorten mp. The
# trainer caps XLA_PYTHON_CLIENT_MEM_FRACTION at 0.90 in multi-process runs (common.sh exports 0.95, which leaves
# NCCL too little of an 80 GiB H100).
# Run: bash scripts/device/run.sh node_acceptance    (PARTS="mp ring4 peer16" BUDGET_S=570 to override)
source scripts/device/common.sh
OUTF=$OUT; W=/tmp/wv; mkdir -p $W; START=$(date +%s); BUDGET_S=${BUDGET_S:-585}; PARTS=${PARTS:-"mp ring4 peer16"}
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
T() { echo "$1 $(( $(date +%s) - START )) s" | tee -a $W/summary.txt; }
pack() { cp $W/summary.txt $OUTF/ 2>/dev/null; tar czf $OUTF/node_acceptance.tgz -C $W . ; }
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee $W/gpus.txt

mp() {
  local SETS=(--set model.init=null --set model.preset=qwen3_8b --set model.overrides.num_layers=${MP_LAYERS:-4}
    --set model.param_dtype=float32 --set model.compute_dtype=float32 --set data.source=synthetic
    --set data.eval_source=null --set data.tokenizer=null --set data.layout=rows --set data.seq_len=2048
    --set data.batch_rows=8 --set grad_accum=1 --set data.num_buckets=1 --set data.num_train=128
    --set "data.synthetic={lengths: [1900]}" --set steps=${MP_STEPS:-8} --set log_every=1 --set eval_before=false
    --set eval_after=false --set tensorboard=false --set progress=false --set mesh.data=2 --set mesh.fsdp=2
    --set mesh.seq=1 --set checkpoint.every=${MP_EVERY:-3} --set checkpoint.async_save=false --set model.remat=full
    --set optim.warmup_ratio=0 --set optim.lr=1e-4)
  local CFG=configs/qwen3_8b_grm_simpo.yaml
  echo "python3 -m longrm_jax.train --config $CFG ${SETS[*]}" > $W/mp_command.txt
  ( export XLA_FLAGS="--xla_gpu_deterministic_ops=true"
    timeout -s KILL 120 python3 -m longrm_jax.train --config $CFG "${SETS[@]}" --set output_dir=/tmp/runs/mp1 \
      > $W/mp1.log 2>&1; echo "mp1 rc=$?" | tee -a $W/summary.txt
    python3 -m longrm_jax.launch -n 4 train --config $CFG "${SETS[@]}" --set output_dir=/tmp/runs/mp4 > $W/mp4.log 2>&1 &
    local launcher=$!
    for i in $(seq 1 600); do grep -q "step ${MP_KILL:-4}/${MP_STEPS:-8}" $W/mp4.log && break; kill -0 $launcher 2>/dev/null || break; sleep 0.2; done
    pkill -KILL -f "longrm_jax.train"; kill -KILL $launcher 2>/dev/null; wait $launcher 2>/dev/null
    echo "mp4 SIGKILLed after: $(grep -o 'step [0-9]/[0-9]' $W/mp4.log | tail -1); checkpoints: $(ls /tmp/runs/mp4/checkpoints)" | tee -a $W/summary.txt
    cp /tmp/runs/mp4/metrics.jsonl $W/mp4_killed.metrics.jsonl
    timeout -s KILL 120 python3 -m longrm_jax.launch -n 4 train --config $CFG "${SETS[@]}" --set output_dir=/tmp/runs/mp4 \
      --resume > $W/mp4r.log 2>&1; echo "mp4r rc=$?" | tee -a $W/summary.txt
    grep -m1 -i "resumed" $W/mp4r.log | tee -a $W/summary.txt )
  cp /tmp/runs/mp1/metrics.jsonl $W/mp1.metrics.jsonl; cp /tmp/runs/mp4/metrics.jsonl $W/mp4r.metrics.jsonl
  python3 scripts/device/compare_losses.py $W/mp1.metrics.jsonl $W/mp4_killed.metrics.jsonl | tee -a $W/summary.txt
  python3 scripts/device/compare_losses.py $W/mp1.metrics.jsonl $W/mp4r.metrics.jsonl | tee -a $W/summary.txt
  [ "${EXPORT:-1}" = 1 ] && timeout -s KILL 90 python3 -m longrm_jax.export --checkpoint /tmp/runs/mp4/checkpoints --out /tmp/runs/mp4_hf \
    > $W/export.log 2>&1; echo "export rc=$? $(ls /tmp/runs/mp4_hf | tr '\n' ' ')" | tee -a $W/summary.txt
}

for p in $PARTS; do
  case $p in
    mp) if [ $(left) -gt 250 ]; then mp; else echo "mp skipped" | tee -a $W/summary.txt; fi; T "mp done" ;;
    ring4) t=$(( $(left) - 10 )); [ $t -gt 280 ] && t=280
       if [ $t -gt 180 ]; then
         mkdir -p $W/ring; OUT=$W/ring W=/tmp/wv_ring RUNS=ring4 RING_S=$t BUDGET_S=$((t + 5)) EXTRA_SETS="--set model.remat=save_attention_out" \
           bash scripts/device/run.sh node_scaling > $W/ring4.txt 2>&1; tail -12 $W/ring4.txt | tee -a $W/summary.txt
       else echo "ring4 skipped: $(left) s left" | tee -a $W/summary.txt; fi; T "ring4 done" ;;
    peer16) if [ $(left) -gt 205 ]; then
         mkdir -p $W/peer; OUT=$W/peer W=/tmp/wv_peer L=16384 PARTS=1 BUDGET_S=$(( $(left) - 5 )) bash scripts/device/run.sh fsdp2_peer_node \
           > $W/peer16.txt 2>&1; tail -12 $W/peer16.txt | tee -a $W/summary.txt
       else echo "peer16 skipped: $(left) s left" | tee -a $W/summary.txt; fi; T "peer16 done" ;;
  esac
  pack
done
pack; cat $W/summary.txt
