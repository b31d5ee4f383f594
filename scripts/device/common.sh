# Sourced by every GPU recipe first. Installs the carried wheels that the GPU
# image lacks (grain + array-record/portpicker, tokamax + einshape/pydantic/qwix/immutabledict, tensorboardX,
# peft 0.21.2: bench_train.py's PyTorch peer of a LoRA run trains the same adapters through it)
# (xprof is not carried: longrm_jax.ops.flash registers a stand-in when tokamax asks for it).
set -o pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
grep MemTotal /proc/meminfo
python3 -c "import jax, flax, optax, grain, tensorboardX; from longrm_jax.ops import flash; flash._tokamax(); print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())" \
  || { echo "imports failed"; exit 1; }
# Common overrides, as session 10 (docs/benchmarks.md) ran them. run_train NAME TIMEOUT_S CONFIG L [--set k=v ...]:
# one `python -m longrm_jax.train` run, log in $OUT/NAME.log, host/GPU memory sampled every 5 s in $OUT/NAME.mon.
run_train() {
  local name=$1 t=$2 cfg=$3 L=$4; shift 4
  local sets=(--set model.init=null --set data.source=synthetic --set data.eval_source=null --set data.tokenizer=null
    --set data.layout=rows --set data.seq_len=$L --set data.batch_rows=2 --set grad_accum=1 --set data.num_buckets=1
    --set data.num_train=8 --set "data.synthetic={lengths: [$((L - 64))]}" --set steps=${STEPS:-2} --set log_every=1
    --set eval_before=false --set eval_after=false --set checkpoint.every=0 --set checkpoint.at_end=false
    --set tensorboard=false --set progress=false --set mesh.seq=1 --set mesh.fsdp=1 --set mesh.data=1
    --set output_dir=/tmp/runs/$name)
  echo "=== $name $(date -u +%T) python3 -m longrm_jax.train --config $cfg ${sets[*]} $*" >> $OUT/commands.txt
  echo "=== $name $(date -u +%T) L=$L $*" | tee -a $OUT/summary.txt
  ( while sleep 5; do echo "$(date -u +%T) host_used_GiB=$(free -g | awk '/Mem:/{print $3}') gpu=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"; done ) > $OUT/$name.mon &
  local mon=$!
  timeout $t python3 -m longrm_jax.train --config $cfg "${sets[@]}" "$@" > $OUT/$name.log 2>&1
  local rc=$?
  kill $mon 2>/dev/null; wait $mon 2>/dev/null
  echo "rc=$rc" | tee -a $OUT/summary.txt
  grep -iE "tokens/s|mfu|peak|predicted|refus|remat|error|Traceback" $OUT/$name.log | tail -10 | cut -c1-400 | tee -a $OUT/summary.txt
  awk -F'host_used_GiB=' '{split($2,a," "); if (a[1]+0>m) m=a[1]+0} END {print "max host used GiB (free -g):", m}' $OUT/$name.mon | tee -a $OUT/summary.txt
  cp /tmp/runs/$name/memory_plan.json $OUT/$name.plan.json 2>/dev/null
  cp /tmp/runs/$name/metrics.jsonl $OUT/$name.metrics.jsonl 2>/dev/null  # MFU and measured peak GiB per step
}
