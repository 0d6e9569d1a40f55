#!/usr/bin/env bash
# The whole test suite on a fresh or existing checkout: venv, install, pytest. Extra args go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/venv.sh"
# The multi-host test bed's lossy-link test needs iptables (statistic match). Install it where we
# can (root, Debian); otherwise that test skips and says why.
if [ "$(id -u)" = 0 ] && ! command -v iptables >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  echo "test.sh: installing iptables for the test bed's lossy-link test (apt-get, about 20 s)"
  { apt-get install -y -q iptables || { apt-get update -q && apt-get install -y -q iptables; }; } >/dev/null 2>&1 \
    || echo "test.sh: could not install iptables; the lossy-link test will skip"
fi
cd "$ROOT"
echo "test.sh: pytest on the whole suite (17 min on a quiet 2-core machine, 2026-11-26;" \
     "a dot per test; a multi-process test module takes up to ~120 s without a dot: tests/test_multinode_train.py)"
python -m pytest -q "$@"
