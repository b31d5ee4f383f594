# What a synchronous checkpoint of the H100 full-parameter recipe costs (2 x 32K, a save per step).
# Machine: one H100 80 GB with the lent machine's 64 GB disk. Qwen3-8B SimPO with full parameters with the H100's
# recipe (moments and layer inputs in pinned host memory, so its saves are synchronous by default), 2 x 32K, three
# steps, a checkpoint after each (keep 1, delete_oldest: the 64 GB disk holds one 49 GB state; save_host_gb 8).
# The trainer prints "checkpoint step N: written in X s"; those lines go to summary.txt. Outputs in $OUT:
# summary.txt, commands.txt and sync_checkpoint_cost_h100.tgz (log, memory samples, plan, metrics, disk.txt).
# Run: bash scripts/device/run.sh sync_checkpoint_cost_h100
source scripts/device/common.sh
W=/tmp/w; mkdir -p $W; OUTF=$OUT; OUT=$W
df -h /tmp | tail -1 | tee $W/disk.txt
REC=(--set model.preset=qwen3_8b --set model.param_dtype=bfloat16 --set model.remat=offload_layer_inputs
     --set model.mlp_chunk_tokens=8192 --set optim.offload_state=true --set checkpoint.every=1 --set checkpoint.keep=1
     --set checkpoint.on_low_disk=delete_oldest --set checkpoint.save_host_gb=8)
STEPS=3 run_train simpo_sync_save_h100 560 configs/qwen3_8b_grm_simpo.yaml 32768 "${REC[@]}"
grep -E "checkpoint|step [0-9]/|summary" $W/simpo_sync_save_h100.log | tee -a $W/summary.txt
cp $W/summary.txt $W/commands.txt $OUTF/; tar czf $OUTF/sync_checkpoint_cost_h100.tgz -C $W .
cat $OUTF/summary.txt
