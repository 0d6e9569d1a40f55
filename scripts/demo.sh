#!/usr/bin/env bash
# The main job on its embedded default: venv, install, then `hal info` and `hal demo`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/venv.sh"
cd "$ROOT"
hal info
hal demo "$@"
