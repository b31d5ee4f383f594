# Qwen3-8B full-parameter SimPO at 2 x 128K on one H100: moments on the host, 35 of 36 layers offloaded.
# Machine: one H100 80 GB on a host with 128 GiB of RAM. Qwen3-8B full-parameter SimPO at 2 x 128K, the pair the
# compile-only GPU model of optim.offload_state admits (docs/compile_only.md): AdamW moments on the host, the first
# 35 of 36 layers' inputs offloaded, MLP in 8,192-token tiles, host_memory_budget_gib=102. Expected (compiled for
# h100x1): gradients 61.1 GiB, update 67.8 GiB (an upper bound: at 2 x 96K a run plans 63.3 where the compile says
# 67.8) + 100.5 GiB pinned host, and beyond the pinned memory some 18.5 GiB more of host RAM (as at 2 x 96K).
# STEPS (default 2): two steps (~107 s each at 40% MFU) plus the compile fit one 10-minute call. Outputs in $OUT:
# summary.txt, commands.txt and simpo_full_128k_h100.tgz (the run's log, memory samples, plan and metrics).
# Run: bash scripts/device/run.sh simpo_full_128k_h100
source scripts/device/common.sh
W=/tmp/w; mkdir -p $W; OUTF=$OUT; OUT=$W
FULL=(--set model.preset=qwen3_8b --set model.param_dtype=bfloat16 --set model.mlp_chunk_tokens=8192
      --set optim.offload_state=true --set model.remat=offload_layer_inputs --set model.offloaded_layers=35
      --set host_memory_budget_gib=102)
STEPS=${STEPS:-2} run_train simpo_full_2x128k_h100 570 configs/qwen3_8b_grm_simpo.yaml 131072 "${FULL[@]}"
cp $W/summary.txt $W/commands.txt $OUTF/; tar czf $OUTF/simpo_full_128k_h100.tgz -C $W .
cat $OUTF/summary.txt
