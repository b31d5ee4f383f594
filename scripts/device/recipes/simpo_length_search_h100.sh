# scripts/bench_train.py --search: Qwen3-8B full-parameter SimPO on one H100, 2 x 32K to 2 x 64K.
# Machine: one H100 80 GB. `scripts/bench_train.py --search`, Qwen3-8B full-parameter SimPO: the longest pair on
# the device (`full`) and with layer inputs offloaded (plus AdamW moments on the host and the tiled MLP), doubling
# from 2 x 32K to 2 x 64K (the plan refuses what cannot fit in one compile; longer pairs: simpo_full_longest_h100
# and simpo_full_128k_h100). Outputs in $OUT: search.log, search.json, bench_train.md.
# Run: bash scripts/device/run.sh simpo_length_search_h100
source scripts/device/common.sh
timeout 570 python3 scripts/bench_train.py --search --models qwen3_8b --stages simpo --devices 1 --no-torch \
  --search-remats full,offload_layer_inputs --search-start 32768 --search-step 32768 --search-max 65536 \
  --warmup 0 --steps 1 --set optim.offload_state=true --set model.mlp_chunk_tokens=8192 \
  --benchmarks-md $OUT/bench_train.md --json $OUT/search.json > $OUT/search.log 2>&1; echo "search rc=$?"
grep -vE "^\s*$" $OUT/search.log | tail -25 | cut -c1-300
