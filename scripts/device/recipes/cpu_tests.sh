# Chosen tests on the lent machine's CPU cores (JAX_PLATFORMS=cpu): PYTEST_ARGS (required), WORKERS (default 2).
# Same environment as cpu_suite (its header says what the carried wheels cover and what does not run here).
source scripts/device/common.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/test/*.whl || { echo "test wheel install failed"; exit 1; }
export JAX_PLATFORMS=cpu CUDA_VISIBLE_DEVICES=""
[ -n "${PYTEST_ARGS:-}" ] || { echo "cpu_tests: set PYTEST_ARGS" >&2; exit 2; }
timeout "${SUITE_S:-540}" python3 -m pytest -n "${WORKERS:-2}" -p no:cacheprovider --durations=10 $PYTEST_ARGS \
  > "$OUT/tests.log" 2>&1
rc=$?
tail -30 "$OUT/tests.log"
exit $rc
