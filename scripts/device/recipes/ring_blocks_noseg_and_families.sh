# 1 GPU: ring block shapes without segment ids; Qwen2.5-7B and Mistral-NeMo-12B DisRM at 2 x 64K.
# Machine: one H100 (kind nvidia-h100-x1). PARTS picks (default "diag qwen25 nemo"):
#   diag   scripts/device/diag_ring_blocks.py --no-segments: the ring's zigzag off-diagonal block shapes on the
#          kernels a rows-layout ring trains with (Mosaic forward, cuDNN backward), c = 16K.
#   qwen25 configs/qwen25_7b_disrm_bt.yaml as shipped (fp32 base, LoRA r=8, remat full, YaRN x4), random weights,
#          synthetic 2 x L pairs (L default 65536; rows layout, 131,072 tokens a step), 3 steps.
#   nemo   configs/mistral_nemo_12b_disrm_bt.yaml likewise (offload_layer_inputs, 8K MLP tiles).
# Outputs in $OUT: diag_noseg.txt; summary.txt, commands.txt and each run's log, memory samples, plan and metrics.
# Run: bash scripts/device/run.sh ring_blocks_noseg_and_families   (PARTS="diag qwen25 nemo")
source scripts/device/common.sh
START=$(date +%s); PARTS=${PARTS:-"diag qwen25 nemo"}; L=${L:-65536}
for p in $PARTS; do
  case $p in
    diag) timeout -s KILL 120 python3 scripts/device/diag_ring_blocks.py --chunk 16384 --rows 2 --no-segments 2>&1 \
            | grep -v -i "warn\|autotun" | tee $OUT/diag_noseg.txt ;;
    qwen25) STEPS=3 run_train qwen25 200 configs/qwen25_7b_disrm_bt.yaml $L ;;
    nemo) STEPS=3 run_train nemo 240 configs/mistral_nemo_12b_disrm_bt.yaml $L ;;
  esac
  echo "$p done at $(( $(date +%s) - START )) s" | tee -a $OUT/summary.txt
done
