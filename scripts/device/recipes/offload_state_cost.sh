# What optim.offload_state costs per step: Qwen3-8B SimPO 2 x 32K, moments on the device vs the host.
# Machine: one H100 80 GB. Qwen3-8B SimPO full parameters, bf16, 2 x 32K, offload_layer_inputs + tiled MLP, 4 steps
# each, with and without optim.offload_state (same process layout). Compare the last steps' seconds.
# Outputs in $OUT: summary.txt, commands.txt and offload_state_cost.tgz (both runs' logs, memory samples, plans and
# metrics).
# Run: bash scripts/device/run.sh offload_state_cost
source scripts/device/common.sh
W=/tmp/w; mkdir -p $W; OUTF=$OUT; OUT=$W
FULL=(--set model.preset=qwen3_8b --set model.param_dtype=bfloat16 --set model.mlp_chunk_tokens=8192
      --set model.remat=offload_layer_inputs)
STEPS=4 run_train simpo_2x32k_state_dev 270 configs/qwen3_8b_grm_simpo.yaml 32768 "${FULL[@]}" --set optim.offload_state=false
STEPS=4 run_train simpo_2x32k_state_host 270 configs/qwen3_8b_grm_simpo.yaml 32768 "${FULL[@]}" --set optim.offload_state=true
cp $W/summary.txt $W/commands.txt $OUTF/; tar czf $OUTF/offload_state_cost.tgz -C $W .
cat $OUTF/summary.txt
