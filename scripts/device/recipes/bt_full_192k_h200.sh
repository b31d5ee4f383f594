# The H200's longest full-parameter pair: Qwen3-8B BT 2 x 192K, 32 of 36 layers offloaded.
# Was call J (issue 30, the H200's longest full-parameter pair): Qwen3-8B shapes, BT, full parameters, 2 x 192K on one
# H200 with `remat: auto` and the lent host's budget: compiled (docs/benchmarks.md "Full-parameter 2 x 192K on one
# H200, compiled"), auto picks offload_layer_inputs + tiled MLP with the first 32 of 36 layers offloaded, 112.4 GiB
# on the device + 96 GiB pinned host. The explicit settings skip auto's eight compiles on the device; one step
# (~214 s at 40% MFU plus the compile and the pinned allocation) fits the 10-minute call; set STEPS=2 on a call
# with time for the steady state. Run (needs_h200): bash scripts/device/run.sh bt_full_192k_h200
source scripts/device/common.sh
W=/tmp/w; mkdir -p $W; OUTF=$OUT; OUT=$W
FULL=(--set lora.rank=0 --set model.preset=qwen3_8b --set model.param_dtype=bfloat16 --set model.remat=offload_layer_inputs
      --set model.mlp_chunk_tokens=8192 --set model.offloaded_layers=32 --set host_memory_budget_gib=96)
STEPS=${STEPS:-1} run_train bt_full_2x192k_h200 575 configs/llama31_8b_disrm_bt.yaml 196608 "${FULL[@]}"
cp $W/summary.txt $W/commands.txt $OUTF/; tar czf $OUTF/bt_full_192k_h200.tgz -C $W .
cat $OUTF/summary.txt
