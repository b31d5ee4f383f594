# The ring's in-place zigzag blocks against the previous ring (.prev/), 2 x 64K over mesh.seq=2.
# Machine: 2 GPUs of one host (kind nvidia-h100-x2). The ring's in-place zigzag blocks (two c x c calls per
# off-diagonal block, accumulators updated in place; the commit after edc3fc2) against the previous ring (half-size
# calls padded to full size under lax.cond), on the same 2 GPUs: one 2 x 64K pair over mesh.seq=2 (each GPU 64K
# tokens: the per-GPU load and c = 16K of the 2 x 128K pair over seq=4), Qwen3-8B SimPO, bf16, remat
# save_attention_out, 3 steps each. The previous ring is a copy of longrm_jax at edc3fc2 in .prev/ (git-excluded;
# carry it with .whl). ORDER (default "new old"): which runs, in order. Outputs in $OUT: summary.txt (with the ring
# module each run loaded), commands.txt and each run's log, memory samples, plan and metrics.
# Run: bash scripts/device/run.sh ring_inplace_vs_prev_2gpu   (ORDER="new old" by default)
source scripts/device/common.sh
BASE=(--set model.preset=qwen3_8b --set model.param_dtype=bfloat16 --set model.remat=save_attention_out
      --set data.num_train=64 --set mesh.seq=2)
# `python -m` puts the working directory first on sys.path, so the previous package runs from inside .prev/ (a
# PYTHONPATH entry alone loses to the checkout's longrm_jax).
for v in ${ORDER:-new old}; do
  if [ $v = old ]; then D=.prev; ln -sfn ../configs .prev/configs; else D=.; fi
  ( cd $D && STEPS=3 run_train ring2_$v 230 configs/qwen3_8b_grm_simpo.yaml 65536 "${BASE[@]}"
    python3 -c "import longrm_jax.ops.ring as r; print('ring module', r.__file__, 'in-place' if hasattr(r, '_zigzag_pairs') else 'padded')" | tee -a $OUT/summary.txt )
done
