# Longest Llama-3.1-8B BT LoRA pair on one H100: 2 x 192K, falling back to 2 x 160K.
# Machine: one H100 80 GB on a host with 128 GiB of RAM. The longest LoRA BT pair (bf16 base, offload_layer_inputs,
# MLP in 8,192-token tiles): 2 x 192K first (host_memory_budget_gib=100); if it fails within 200 s (plan refusal,
# host cap), 2 x 160K in the same call. ~9 min at most; STEPS steps each (default 2). Outputs in $OUT: summary.txt,
# commands.txt and lora_bt_longest_h100.tgz (each run's log, memory samples, plan and metrics).
# Run: bash scripts/device/run.sh lora_bt_longest_h100
source scripts/device/common.sh
W=/tmp/w; mkdir -p $W; OUTF=$OUT; OUT=$W
LORA=(--set model.preset=llama31_8b --set lora.base_dtype=bfloat16 --set model.remat=offload_layer_inputs
      --set model.mlp_chunk_tokens=8192)
t0=$SECONDS
run_train lora_bt_2x192k 540 configs/llama31_8b_disrm_bt.yaml 196608 "${LORA[@]}" --set host_memory_budget_gib=100
if ! grep -q "rc=0" <(tail -12 $W/summary.txt) && (( SECONDS - t0 < 200 )); then
  run_train lora_bt_2x160k $((560 - (SECONDS - t0))) configs/llama31_8b_disrm_bt.yaml 163840 "${LORA[@]}"
fi
cp $W/summary.txt $W/commands.txt $OUTF/; tar czf $OUTF/lora_bt_longest_h100.tgz -C $W .
cat $OUTF/summary.txt
