# Ours mesh.fsdp=4 against the PyTorch FSDP2 peer on 4 GPUs (part 1), one-GPU baselines (part 2).
# Machine: 4 GPUs of one host (kind nvidia-h100-x4). Ours against the PyTorch peer on a node, per GPU, same machine,
# same pairs per GPU. Qwen3-8B shapes, random weights, full parameters, rows layout, remat auto, a pair per GPU:
#   part 1  ours mesh.fsdp=4 (4 pairs a step) and the peer on 4 GPUs (one process per GPU started by
#           bench_train.py: FSDP2 fully_shard per decoder layer + root, SDPA, activation checkpointing, bf16
#           weights / AdamW state, NCCL): the acceptance comparison, run first;
#   part 2  the same machine's one-GPU baselines: ours on GPU 0 and the one-GPU peer.
# STAGE (default simpo) and L (tokens per sample; default below) pick the pairs. The one-GPU peer's SimPO does not
# fit 2 x 32K even on an H200 (its fp32 all-vocabulary logits on top of the bf16 weights, gradients and AdamW
# moments: docs/benchmarks.md, "Full 2 x 32K rows, with the peer"), so SimPO defaults to 2 x 8K (estimated: peer
# 1 GPU ~100 GiB, fits an H200, not an H100; peer on 4 GPUs ~50 GiB per GPU). STAGE=bt defaults to 2 x 32K on
# H200 (the peer's one-GPU point of the same section) and 2 x 16K on H100 (peer ~70.6 GiB).
# Each part is one `scripts/bench_train.py` invocation (one step + 1 warm-up untimed, 2 timed, medians) under its
# own `timeout`; the call ends within BUDGET_S (default 450 s). PARTS (default "1 2"), W (work folder, default
# /tmp/w), NCCL_NVLS_ENABLE (default 0: NVLink multicast off). Rows are appended to $OUT/rows.jsonl as they finish
# and every table to $OUT/bench.md, the parts' summaries to $OUT/summary.txt; everything is packed into
# $OUT/fsdp2_peer_node.tgz as it goes (a cut-off call keeps what finished).
# Run: bash scripts/device/run.sh fsdp2_peer_node      (STAGE=bt L=32768 BUDGET_S=450 PARTS="1 2" to override)
source scripts/device/common.sh
OUTF=$OUT; W=${W:-/tmp/w}; mkdir -p $W; OUT=$W
START=$(date +%s); BUDGET_S=${BUDGET_S:-450}; PARTS=${PARTS:-"1 2"}; STAGE=${STAGE:-simpo}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # NVLink multicast stays off (KINDS.md)
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee $W/gpus.txt
nvidia-smi topo -m > $W/topo.txt 2>&1
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'nccl', torch.cuda.nccl.version())" | tee $W/versions.txt
GPU_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ -z "$L" ]; then
  if [ "$STAGE" = simpo ]; then L=8192; elif [ "$GPU_MIB" -gt 100000 ]; then L=32768; else L=16384; fi
fi
echo "STAGE=$STAGE L=$L GPU_MIB=$GPU_MIB BUDGET_S=$BUDGET_S" | tee -a $W/summary.txt
COMMON=(--models qwen3_8b --stages $STAGE --lengths $L --full-params --mesh fsdp --remat auto --warmup 1 --steps 2
        --json $W/rows.jsonl --benchmarks-md $W/bench.md)
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
part() {  # part NAME MIN_S MAX_S bench_train flags...: run it if MIN_S are left, for at most MAX_S (and what is left)
  local name=$1 need=$2 max=$3; shift 3
  if [ $(left) -lt $need ]; then echo "=== $name skipped: $(left) s left" | tee -a $W/summary.txt; return; fi
  echo "=== $name $(date -u +%T) python3 scripts/bench_train.py ${COMMON[*]} $*" | tee -a $W/commands.txt $W/summary.txt
  ( while sleep 5; do echo "$(date -u +%T) gpu=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader | tr '\n' ' ')"; done ) > $W/$name.mon &
  local mon=$!
  local t=$(( $(left) - 5 )); [ $t -gt $max ] && t=$max
  timeout $t python3 scripts/bench_train.py "${COMMON[@]}" "$@" > $W/$name.log 2>&1
  local rc=$?
  kill $mon 2>/dev/null; wait $mon 2>/dev/null
  echo "rc=$rc ($(( $(date +%s) - START )) s into the call)" | tee -a $W/summary.txt
  grep -E "^\| |^Longest|skipped|Error|Traceback" $W/$name.log | cut -c1-400 | tee -a $W/summary.txt
  tar czf $OUTF/fsdp2_peer_node.tgz -C $W .
}
for p in $PARTS; do
  case $p in
    1) part node4 200 270 --devices 4 --peer-gpus 4 --peer-timeout 150 ;;
    2) part one_gpu 150 400 --devices 1 --peer-gpus 1 ;;
  esac
done
echo "=== total $(( $(date +%s) - START )) s" | tee -a $W/summary.txt
tar czf $OUTF/fsdp2_peer_node.tgz -C $W .; cp $W/summary.txt $W/bench.md $W/rows.jsonl $OUTF/ 2>/dev/null; cat $W/summary.txt
