#!/usr/bin/env bash
# The whole test suite on a fresh or existing checkout: venv, install, pytest. Extra args go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/venv.sh"
cd "$ROOT"
python -m pytest -q "$@"
