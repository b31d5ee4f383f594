# 4-GPU steps against one GPU of the same machine, Qwen3-8B SimPO, each profiled (RUNS picks).
# Machine: 4 GPUs of one host (kind nvidia-h100-x4; data4 needs H200s). Where a 4-GPU step loses time against one
# GPU of the same machine. Qwen3-8B full-parameter SimPO (random weights, synthetic pairs, rows layout), remat auto,
# three steps each, step 3 profiled and summarised on the machine (scripts/profile_summary.py). RUNS picks, in order
# (default "1gpu fsdp4 data4 fsdp4f"), from:
#   1gpu   GPU 0 alone (CUDA_VISIBLE_DEVICES=0), one 2 x 32K pair: the baseline of this machine, this call;
#   fsdp4  mesh.fsdp=4, 4 pairs of 2 x 32K (one per GPU);
#   data4  mesh.data=4, 4 pairs (weights and moments replicated: 8B needs an H200's memory; skipped on H100);
#   fsdp4f fsdp4 with the collective-overlap XLA flags exported as a user would, and CUDA_DEVICE_MAX_CONNECTIONS=1;
#   fsdp4off fsdp4 with the overlap settings the trainer applies by default turned off through XLA_FLAGS (a flag
#          the user sets wins): the control for what those defaults add (docs/perf_training.md, "With the overlap
#          settings on by default");
#   ring4  mesh.seq=4, one 2 x 128K pair (ring attention; RING_S, default 250, its limit); ring4f the same with the
#          overlap flags.
# EXTRA_SETS (optional, word-split) is appended to every run's overrides, e.g. "--set model.remat=save_attention_out"
# (what auto picks for these runs) to skip remat=auto's candidate compiles. W: work folder (default /tmp/w).
# A run starts only while the call has time for it (BUDGET_S, default 540); everything is packed into
# $OUT/node_scaling.tgz as it goes, so a call cut off still returns the runs that finished; summary.txt, and per run
# NAME.events.npz (every kernel of every GPU) and NAME.xplane.pb.gz (the trace) beside it.
# Run: RUNS="1gpu fsdp4 ring4" bash scripts/device/run.sh node_scaling
source scripts/device/common.sh
OUTF=$OUT; W=${W:-/tmp/w}; mkdir -p $W; OUT=$W
START=$(date +%s); BUDGET_S=${BUDGET_S:-540}; RUNS=${RUNS:-"1gpu fsdp4 data4 fsdp4f"}
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee $W/gpus.txt
nvidia-smi topo -m > $W/topo.txt 2>&1
env | grep -E "^NCCL_NVLS_ENABLE|^TORCH_SYMM|^NVSHMEM_DISABLE" | tee $W/nccl_env.txt
GPU_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
BASE=(--set model.preset=qwen3_8b --set model.param_dtype=bfloat16 --set model.remat=auto --set data.num_train=64
      --set profile.start=3 --set profile.steps=1)
OVERLAP="--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_pipelined_all_gather=true \
--xla_gpu_enable_pipelined_reduce_scatter=true --xla_gpu_enable_pipelined_all_reduce=true \
--xla_gpu_enable_while_loop_double_buffering=true --xla_gpu_enable_highest_priority_async_stream=true \
--xla_gpu_all_gather_combine_threshold_bytes=536870912 --xla_gpu_reduce_scatter_combine_threshold_bytes=536870912 \
--xla_gpu_enable_command_buffer="
NO_OVERLAP="--xla_gpu_enable_pipelined_all_gather=false --xla_gpu_enable_pipelined_reduce_scatter=false \
--xla_gpu_enable_while_loop_double_buffering=false --xla_gpu_enable_highest_priority_async_stream=false"
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
one() {  # one NAME LIMIT_S L [--set ...]: run it if the call has LIMIT_S left, then summarise its profile
  local name=$1 t=$2 L=$3; shift 3
  if [ $(left) -lt $t ]; then echo "=== $name skipped: $(left) s left" | tee -a $W/summary.txt; return; fi
  STEPS=3 run_train $name $t configs/qwen3_8b_grm_simpo.yaml $L "${BASE[@]}" "$@" ${EXTRA_SETS}
  python3 scripts/profile_summary.py /tmp/runs/$name/profile --top 25 --json $W/$name.profile.json \
    --events $OUTF/$name.events.npz > $W/$name.profile.txt 2>&1; grep -E "span|exposed" $W/$name.profile.txt | head -8
  # every kernel of every GPU (scripts/profile_summary.py --events): small enough to come back when the trace is not
  # the trace itself (its critical path, in TensorBoard / xprof), compressed, as its own file outside the tarball:
  # if it is over what the device tool brings back, only it is left out
  find /tmp/runs/$name/profile -name "*.xplane.pb" -size -400M -exec gzip -c {} \; > $OUTF/$name.xplane.pb.gz 2>/dev/null
  tar czf $OUTF/node_scaling.tgz -C $W .
}
for run in $RUNS; do
  case $run in
    1gpu) CUDA_VISIBLE_DEVICES=0 one 1gpu 150 32768 ;;
    fsdp4) one fsdp4 160 32768 --set mesh.fsdp=4 --set data.batch_rows=8 ;;
    data4) [ "$GPU_MIB" -gt 100000 ] && one data4 160 32768 --set mesh.data=4 --set data.batch_rows=8 ;;
    fsdp4f) XLA_FLAGS="$OVERLAP" CUDA_DEVICE_MAX_CONNECTIONS=1 one fsdp4f 160 32768 --set mesh.fsdp=4 --set data.batch_rows=8 ;;
    fsdp4off) XLA_FLAGS="$NO_OVERLAP" one fsdp4off 160 32768 --set mesh.fsdp=4 --set data.batch_rows=8 ;;
    ring4) one ring4 ${RING_S:-250} 131072 --set mesh.seq=4 ;;
    ring4f) XLA_FLAGS="$OVERLAP" CUDA_DEVICE_MAX_CONNECTIONS=1 one ring4f 250 131072 --set mesh.seq=4 ;;
  esac
done
echo "=== total $(( $(date +%s) - START )) s"; cp $W/summary.txt $OUTF/; cat $W/summary.txt
