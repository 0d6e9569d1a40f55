#!/usr/bin/env bash
# The main job on its embedded default: venv, install, `hal info`, then `hal train` on the default
# emulated mixed cluster (2 cuda + 2 ascend, timed emulation, plan auto, each sub-cluster measured alone
# first): examples/train/mixed.toml. `hal demo` (DDP parity over the bridge) is one command away.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/venv.sh"
cd "$ROOT"
hal info
hal train --config examples/train/mixed.toml --measure-parts "$@"
