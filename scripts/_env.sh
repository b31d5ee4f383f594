# Shared by scripts/quickstart.sh and scripts/test.sh (sourced, not run): find a Python 3.12 interpreter,
# create or reuse the virtual environment and install the project with the requested extra.
#
# Environment knobs: LONGRM_PYTHON (an interpreter to use), LONGRM_VENV (default .venv). pip's own variables
# (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_CACHE_DIR, ...) pass through.

PY_WANT="3.12"
VENV="${LONGRM_VENV:-.venv}"

_is_py312() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; }

find_python() {
  # 1. explicit choice; 2. python3.12 / python3 on PATH that really run (a pyenv shim may not);
  # 3. pyenv's 3.12.x; 4. one uv provides (uv itself is pip-installed into .cache/uv-tool if missing).
  local cand v
  for cand in "${LONGRM_PYTHON:-}" python3.12 python3 python; do
    [ -n "$cand" ] && _is_py312 "$cand" && { command -v "$cand" 2>/dev/null || echo "$cand"; return 0; }
  done
  if command -v pyenv >/dev/null 2>&1; then
    for v in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.12(\.[0-9]+)?$' | sort -t. -k3 -n -r); do
      cand="$(PYENV_VERSION="$v" pyenv which python3.12 2>/dev/null || true)"
      [ -n "$cand" ] && _is_py312 "$cand" && { echo "$cand"; return 0; }
    done
  fi
  for cand in "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    [ -x "$cand" ] && _is_py312 "$cand" && { echo "$cand"; return 0; }
  done
  local uv
  uv="$(command -v uv 2>/dev/null || true)"
  if [ -z "$uv" ]; then
    local boot
    boot="$(command -v python3 2>/dev/null || true)"
    [ -n "$boot" ] || return 1
    echo "no Python $PY_WANT found: installing uv to provide one" >&2
    "$boot" -m venv .cache/uv-tool >&2 && .cache/uv-tool/bin/python -m pip install -q uv >&2 || return 1
    uv=.cache/uv-tool/bin/uv
  fi
  "$uv" python install "$PY_WANT" >&2 || return 1
  "$uv" python find "$PY_WANT"
}

# What the first install of EXTRA downloads (measured on Linux x86_64, Python 3.12, 2026-11-27: the base
# closure is 75 packages, 1.3 GB installed, jaxlib 350 MB of it; the test extra adds 62 packages, 5.4 GB
# installed, torch's CUDA build with its nvidia-* libraries and triton 4 GB of it, libtpu 0.7 GB).
install_note() {
  if [ -z "$1" ]; then
    echo "the first time downloads a few hundred MB: jax, transformers, datasets, ...; 1.3 GB installed"
  else
    echo "the first time downloads a few GB: the $1 extra's torch, a CUDA build with its nvidia libraries, and libtpu; about 7 GB installed"
  fi
}

# setup_env EXTRA: .venv with the project installed editable ("" or "test"). Idempotent: a stamp holding the
# hash of pyproject.toml, the extra and the interpreter version skips the install when nothing changed.
setup_env() {
  local extra="$1" py spec stamp want
  if [ -x "$VENV/bin/python" ] && ! _is_py312 "$VENV/bin/python"; then
    echo "$VENV is not Python $PY_WANT: recreating it" >&2
    rm -rf "$VENV"
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    py="$(find_python)" || { echo "error: no Python $PY_WANT interpreter found (tried LONGRM_PYTHON, python3.12," \
      "python3, pyenv, ~/.pyenv/versions, uv); install one, or set LONGRM_PYTHON=/path/to/python3.12" >&2; return 1; }
    echo "creating $VENV with $py ($("$py" --version 2>&1))"
    "$py" -m venv "$VENV" || return 1
  fi
  spec="."
  [ -n "$extra" ] && spec=".[$extra]"
  want="$(cat pyproject.toml | sha256sum | cut -c1-16) $("$VENV/bin/python" --version 2>&1)"
  stamp="$VENV/.longrm-installed-${extra:-base}"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "$VENV is up to date (pip install -e \"$spec\" skipped; delete $stamp to force it)"
    return 0
  fi
  echo "installing: pip install -e \"$spec\" into $VENV ($(install_note "$extra"))"
  "$VENV/bin/python" -m pip install -q --upgrade pip || return 1
  "$VENV/bin/python" -m pip install -q -e "$spec" || return 1
  echo "$want" >"$stamp"
}
