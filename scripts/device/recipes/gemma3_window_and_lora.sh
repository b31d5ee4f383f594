# 1 GPU: Gemma 3's sliding window on cuDNN, and the Gemma 3 12B BT-LoRA config at 2 x 32K.
# Machine: one H100 (kind nvidia-h100-x1). Gemma 3's sliding window on cuDNN, and the Gemma 3 12B BT-LoRA config
# on one GPU. PARTS picks (default "window shipped auto"):
#   window  scripts/bench_attention.py at Gemma 3 12B's attention shape (16 q / 8 kv heads of 256), 32K tokens:
#           cuDNN and XLA with the 1024-token window (checked against the fp32 windowed reference), then cuDNN
#           without it (the time a window saves).
#   shipped configs/gemma3_12b_disrm_bt.yaml as shipped (fp32 base, LoRA r=8, offload_layer_inputs, 8K MLP
#           tiles), random weights, synthetic 2 x L pairs (L default 32768, rows layout), 3 steps.
#   auto    the same with model.remat=auto.
# Outputs in $OUT: window.txt; summary.txt, commands.txt and each run's log, memory samples, plan and metrics.
# Run: bash scripts/device/run.sh gemma3_window_and_lora   (PARTS="window shipped auto")
source scripts/device/common.sh
START=$(date +%s); PARTS=${PARTS:-"window shipped auto"}; L=${L:-32768}
SHAPE=(--heads 16 --kv-heads 8 --head-dim 256 --lengths 32768 --no-record)
for p in $PARTS; do
  case $p in
    window) { timeout -s KILL 150 python3 scripts/bench_attention.py "${SHAPE[@]}" --impls cudnn,xla --window 1024
              timeout -s KILL 90 python3 scripts/bench_attention.py "${SHAPE[@]}" --impls cudnn --check-max-len 0; } 2>&1 \
              | grep -v -i "warn\|autotun" | tee $OUT/window.txt ;;
    shipped) STEPS=3 run_train gemma3 300 configs/gemma3_12b_disrm_bt.yaml $L ;;
    auto) STEPS=3 run_train gemma3_auto 240 configs/gemma3_12b_disrm_bt.yaml $L --set model.remat=auto ;;
  esac
  echo "$p done at $(( $(date +%s) - START )) s" | tee -a $OUT/summary.txt
done
