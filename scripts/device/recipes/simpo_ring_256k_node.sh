# Qwen3-8B full-parameter SimPO at 2 x 256K over 4 GPUs (mesh.seq=4 ring attention), moments on the host.
# Machine: 4 GPUs of one host (kind nvidia-h100-x4). Qwen3-8B full-parameter SimPO on a 2 x 256K pair, the sequence
# split over the four GPUs (mesh.seq=4: ring attention with pallas blocks), remat full and the MLP in 8,192-token
# tiles. Expected memory and step time (compiled for h100x4): docs/compile_only.md, "GPU meshes, compiled, not run".
# With the moments on the device the plan refuses it on four H100s (72.12 GiB against 71.22), so the AdamW moments
# (7.6 GiB per GPU) go to pinned host memory (optim.offload_state). Upstream trains one 128K row on a ring of 8
# GPUs. STEPS (default 2). Outputs in $OUT: summary.txt, commands.txt and simpo_ring_256k_node.tgz (the run's log,
# memory samples, plan, metrics, NCCL environment).
# Run (kind nvidia-h100-x4): bash scripts/device/run.sh simpo_ring_256k_node
source scripts/device/common.sh
W=/tmp/w; mkdir -p $W; OUTF=$OUT; OUT=$W
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
env | grep -E "^NCCL_NVLS_ENABLE|^TORCH_SYMM|^NVSHMEM_DISABLE" | tee $W/nccl_env.txt
RING=(--set model.preset=qwen3_8b --set model.param_dtype=bfloat16 --set model.remat=full --set model.mlp_chunk_tokens=8192
      --set mesh.seq=4 --set optim.offload_state=true)
STEPS=${STEPS:-2} run_train simpo_full_2x256k_h100x4 560 configs/qwen3_8b_grm_simpo.yaml 262144 "${RING[@]}"
cp $W/summary.txt $W/commands.txt $OUTF/; tar czf $OUTF/simpo_ring_256k_node.tgz -C $W .
cat $OUTF/summary.txt
