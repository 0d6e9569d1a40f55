#!/usr/bin/env bash
# Create (or reuse) .venv and install the project into it. Sourced by scripts/demo.sh and
# scripts/test.sh. torch is pinned here, before the project, so that pyproject's range never pulls a
# multi-GB CUDA build: `pip install torch==2.13.0` takes the CPU build on a CPU machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HAL_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[venv] creating $VENV"
  "$PY" -m venv "$VENV"
fi
# Reinstall only when what the install depends on changed (pyproject, setup.py, C++ sources).
STAMP="$VENV/.hal-install-stamp"
WANT="$( (cat "$ROOT/pyproject.toml" "$ROOT"/setup.py "$ROOT"/csrc/* 2>/dev/null || true) | sha256sum | cut -d' ' -f1)"
# flock: several shells (or CI steps) may call this at once; one installs, the others wait.
exec 9>"$VENV/.hal-install-lock"
flock 9
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "[venv] installing torch==2.13.0 and the project (editable)"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[test]"
  echo "$WANT" > "$STAMP"
fi
flock -u 9
export PATH="$VENV/bin:$PATH"
