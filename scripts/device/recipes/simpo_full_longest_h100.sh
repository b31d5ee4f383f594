# Longest full-parameter Qwen3-8B SimPO pair on one H100: 2 x 96K, AdamW moments on the host.
# Machine: one H100 80 GB on a host with 128 GiB of RAM. The longest full-parameter SimPO pair: 2 x 96K with the
# AdamW moments on the host, layer inputs offloaded, tiled MLP; if the plan refuses (within 150 s), the same with
# offload_layer_inputs_and_attention (the plan's refusal message is the result then). STEPS steps each (default 2).
# Outputs in $OUT: summary.txt, commands.txt and simpo_full_longest_h100.tgz (each run's log, memory samples, plan
# and metrics).
# Run: bash scripts/device/run.sh simpo_full_longest_h100
source scripts/device/common.sh
W=/tmp/w; mkdir -p $W; OUTF=$OUT; OUT=$W
FULL=(--set model.preset=qwen3_8b --set model.param_dtype=bfloat16 --set model.mlp_chunk_tokens=8192
      --set optim.offload_state=true)
t0=$SECONDS
run_train simpo_2x96k_oli 500 configs/qwen3_8b_grm_simpo.yaml 98304 "${FULL[@]}" --set model.remat=offload_layer_inputs
if ! grep -q "rc=0" <(tail -12 $W/summary.txt) && (( SECONDS - t0 < 150 )); then
  run_train simpo_2x96k_olia $((560 - (SECONDS - t0))) configs/qwen3_8b_grm_simpo.yaml 98304 "${FULL[@]}" \
    --set model.remat=offload_layer_inputs_and_attention --set host_memory_budget_gib=100
fi
cp $W/summary.txt $W/commands.txt $OUTF/; tar czf $OUTF/simpo_full_longest_h100.tgz -C $W .
cat $OUTF/summary.txt
