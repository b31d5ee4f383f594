# Llama-3.1-8B BT LoRA on one GPU and on four (mesh.data=4), then fsdp2_peer_node's part 1.
# Machine: 4 GPUs of one host (kind nvidia-h100-x4). Llama-3.1-8B Bradley-Terry LoRA from one GPU to four, same
# machine, then part 1 of fsdp2_peer_node (ours mesh.fsdp=4 against the FSDP2 peer on 4 GPUs) in the time left of
# BUDGET_S (default 480 s).
#   lora1  GPU 0 alone (CUDA_VISIBLE_DEVICES=0): one pair of 2 x 32K per step;
#   lora4  mesh.data=4 (the bf16 base and the adapters replicated; only adapter gradients cross GPUs), 4 pairs.
# `python -m longrm_jax.train --config configs/llama31_8b_disrm_bt.yaml` with common.sh's run_train overrides,
# remat auto, 4 steps each. Outputs in $OUT: lora_scaling_node.tgz (logs, memory samples, plans, metrics,
# summary.txt) and fsdp2_peer_node's outputs.
# Run: bash scripts/device/run.sh lora_scaling_node
source scripts/device/common.sh
OUTF=$OUT; W=/tmp/wu; mkdir -p $W; OUT=$W
START=$(date +%s); BUDGET_S=${BUDGET_S:-480}
LORA=(--set model.preset=llama31_8b --set model.remat=auto --set data.num_train=64)
STEPS=4 CUDA_VISIBLE_DEVICES=0 run_train lora1 140 configs/llama31_8b_disrm_bt.yaml 32768 "${LORA[@]}"
tar czf $OUTF/lora_scaling_node.tgz -C $W .
STEPS=4 run_train lora4 140 configs/llama31_8b_disrm_bt.yaml 32768 "${LORA[@]}" --set mesh.data=4 --set data.batch_rows=8
tar czf $OUTF/lora_scaling_node.tgz -C $W .
LEFT=$(( BUDGET_S - ($(date +%s) - START) ))
echo "=== fsdp2_peer_node part 1 with $LEFT s" | tee -a $W/summary.txt
OUT=$OUTF PARTS=1 BUDGET_S=$LEFT bash scripts/device/run.sh fsdp2_peer_node > $W/fsdp2_peer_node.out 2>&1
tail -20 $W/fsdp2_peer_node.out
tar czf $OUTF/lora_scaling_node.tgz -C $W .; cat $W/summary.txt
