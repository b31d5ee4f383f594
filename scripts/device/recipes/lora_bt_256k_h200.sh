# Llama-3.1-8B BT LoRA at 2 x 256K on one H200, 24 of 32 layers offloaded.
# Machine: one H200 (141 GB; the device tool's needs_h200) on a host with 128 GiB of RAM.
# Llama-3.1-8B BT LoRA (bf16 base, offload_layer_inputs, MLP in 8,192-token tiles) at 2 x 256K. Every layer
# offloaded needs 128 GiB of pinned host memory (all of the machine's RAM), so only the first 24 of 32 layers save
# their inputs to the host (`model.offloaded_layers=24`, host_memory_budget_gib=100; the plan `remat: auto` falls
# back to). Expected: compiled, 87.64 GiB on the device + 96 GiB pinned. STEPS (default 1): one step fits the
# 10-minute call (step 1 holds the compile and the one-off pinned allocation). Outputs in $OUT: summary.txt,
# commands.txt and lora_bt_256k_h200.tgz (the run's log, memory samples, plan and metrics).
# Run: bash scripts/device/run.sh lora_bt_256k_h200
source scripts/device/common.sh
W=/tmp/w; mkdir -p $W; OUTF=$OUT; OUT=$W
LORA=(--set model.preset=llama31_8b --set lora.base_dtype=bfloat16 --set model.remat=offload_layer_inputs
      --set model.mlp_chunk_tokens=8192 --set model.offloaded_layers=24 --set host_memory_budget_gib=100)
STEPS=${STEPS:-1} run_train lora_bt_2x256k_h200 575 configs/llama31_8b_disrm_bt.yaml 262144 "${LORA[@]}"
cp $W/summary.txt $W/commands.txt $OUTF/; tar czf $OUTF/lora_bt_256k_h200.tgz -C $W .
cat $OUTF/summary.txt
