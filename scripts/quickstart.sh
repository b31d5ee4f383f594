#!/usr/bin/env bash
# From a fresh clone: find Python 3.12, create/reuse .venv, install the project, run the main job (the
# embedded default: a tiny reward model trained on the CPU; held-out accuracy before and after is printed).
# Extra arguments go to `python -m longrm_jax.train` (e.g. --set steps=20). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh
setup_env ""
exec "$VENV/bin/python" -m longrm_jax.train "$@"
