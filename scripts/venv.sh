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
# Progress: what each step builds, roughly how long, a line every 15 s while it runs, and its time.
_hal_step() {  # _hal_step "what (about how long)" command...
  local what="$1" t0=$SECONDS tick; shift
  echo "[venv] $what"
  ( while sleep 15; do echo "[venv]   ... still working ($((SECONDS - t0)) s): $what"; done ) &
  tick=$!
  if "$@"; then kill "$tick" 2>/dev/null; wait "$tick" 2>/dev/null || true
  else local rc=$?; kill "$tick" 2>/dev/null; wait "$tick" 2>/dev/null || true
    echo "[venv] FAILED after $((SECONDS - t0)) s: $what"; return "$rc"; fi
  echo "[venv]   done in $((SECONDS - t0)) s"
}
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "[venv] installing into $VENV (2 steps; only when pyproject.toml, setup.py or csrc/ changed)"
  _hal_step "1/2 torch==2.13.0, CPU build (a ~200 MB wheel, ~1 GB unpacked: 1 to 2.5 min here; seconds when already installed)" \
    "$VENV/bin/python" -m pip install --progress-bar on --disable-pip-version-check "torch==2.13.0"
  _hal_step "2/2 the project, editable, with its C++ shared-memory fabric hal.emulation.shm._shm (pip builds it with g++: about 30 s on an idle 2-core machine, 2 to 3 min when it is busy; pip prints nothing while it compiles)" \
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[test]"
  echo "$WANT" > "$STAMP"
fi
flock -u 9
export PATH="$VENV/bin:$PATH"
