# The H200's longest full-parameter pair: Qwen3-8B BT 2 x 192K, 32 of 36 layers offloaded.
# Machine: one H200 (141 GB; the device tool's needs_h200) on a host with 96 GiB of RAM to pin.
# Qwen3-8B shapes, BT, full parameters (bf16), 2 x 192K, with the settings `remat: auto` picks under the lent host's
# budget (host_memory_budget_gib=96): offload_layer_inputs + the MLP in 8,192-token tiles, the first 32 of 36
# layers offloaded. The explicit settings skip auto's eight compiles on the device. Expected device memory, pinned
# host memory and step time: docs/benchmarks.md "Full-parameter 2 x 192K on one H200, compiled".
# STEPS (default 1): one step (plus the compile and the pinned allocation) fits the 10-minute call; STEPS=2 on a
# call with time for the steady state. Outputs in $OUT: summary.txt, commands.txt and bt_full_192k_h200.tgz (the
# run's log, memory samples, plan and metrics).
# Run (needs_h200): bash scripts/device/run.sh bt_full_192k_h200
source scripts/device/common.sh
W=/tmp/w; mkdir -p $W; OUTF=$OUT; OUT=$W
FULL=(--set lora.rank=0 --set model.preset=qwen3_8b --set model.param_dtype=bfloat16 --set model.remat=offload_layer_inputs
      --set model.mlp_chunk_tokens=8192 --set model.offloaded_layers=32 --set host_memory_budget_gib=96)
STEPS=${STEPS:-1} run_train bt_full_2x192k_h200 575 configs/llama31_8b_disrm_bt.yaml 196608 "${FULL[@]}"
cp $W/summary.txt $W/commands.txt $OUTF/; tar czf $OUTF/bt_full_192k_h200.tgz -C $W .
cat $OUTF/summary.txt
