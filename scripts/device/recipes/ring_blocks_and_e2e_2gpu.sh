# 2 GPUs: the ring's zigzag block shapes timed (diag), e2e_node's chain at 2 x 32K (e2e).
# Machine: 2 GPUs of one host (kind nvidia-h100-x2). Two diagnoses, PARTS picks (default "diag e2e"):
#   diag  scripts/device/diag_ring_blocks.py: the ring's two zigzag off-diagonal block shapes (q 2c x kv c on the
#         last ring device, q c x kv 2c on the first) timed forward and backward on each GPU, c = 16K (the 2 x 128K
#         pair over seq=4): whether the block shapes explain a first ring GPU whose attention is slower than the
#         last one's in a 4-GPU ring4 profile.
#   e2e   e2e_node's chain (scripts/e2e_gpu.py: HF in, train, SIGKILL, --resume, export, evaluate) over 2 GPUs,
#         2 x L (L default 32768), training checkpoints in /dev/shm (/tmp/e2e if it has under 130 GiB free), one
#         evaluation sample per task: short enough for the evaluation stage on several GPUs to complete in the
#         call (E2E_S: what is left of BUDGET_S, default 570 s).
# Outputs in $OUT: diag.txt; e2e.txt and e2e/ (e2e_node's outputs).
# Run: bash scripts/device/run.sh ring_blocks_and_e2e_2gpu   (PARTS="diag e2e")
source scripts/device/common.sh
START=$(date +%s); PARTS=${PARTS:-"diag e2e"}
for p in $PARTS; do
  case $p in
    diag) timeout -s KILL 150 python3 scripts/device/diag_ring_blocks.py --chunk 16384 --rows 2 2>&1 | tee $OUT/diag.txt | grep -v Warn ;;
    e2e) mkdir -p $OUT/e2e; SHM=$(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9); echo "/dev/shm ${SHM} GiB free"
         WD=/dev/shm/e2e; [ "${SHM:-0}" -lt 130 ] && WD=/tmp/e2e
         OUT=$OUT/e2e W=$WD DEVICES=2 L=${L:-32768} EVAL_SAMPLES=1 \
           E2E_S=$(( ${BUDGET_S:-570} - ($(date +%s) - START) )) bash scripts/device/run.sh e2e_node > $OUT/e2e.txt 2>&1
         tail -30 $OUT/e2e.txt ;;
  esac
  echo "$p done at $(( $(date +%s) - START )) s"
done
