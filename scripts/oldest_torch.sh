#!/usr/bin/env bash
# The oldest-torch lane: the core (hal, the plugins, the bridge, the conformance suite) on torch 2.5.1,
# the floor (what the KunlunXin stack ships), in its own venv. Not part of CI: PyPI has no CPU build
# of torch 2.5.1, so this installs the CUDA build and its nvidia-* wheels (about 2.8 GB downloaded;
# measured in docs/writing-a-plugin.md, "Which torch"). Run it before changing the floor or
# hal/contract/compat.py:
#   bash scripts/oldest_torch.sh            # venv in .venv-torch2.5 (kept; a rerun reuses it)
#   OLDEST_TORCH_VENV=/path/to/venv bash scripts/oldest_torch.sh   # an existing venv with that torch
#   TORCH_FLOOR_VERSION=2.5.0 bash scripts/oldest_torch.sh
# Extra args go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="${TORCH_FLOOR_VERSION:-2.5.1}"
VENV="${OLDEST_TORCH_VENV:-$ROOT/.venv-torch${VERSION%.*}}"
PY="${PYTHON:-python3}"
start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  echo "oldest_torch.sh: creating $VENV with torch==$VERSION (a CUDA build with its nvidia-* wheels: ~2.8 GB)"
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q "torch==$VERSION" numpy "pluggy>=1.5" "pydantic>=2.6" "pytest>=8" "pybind11>=2.10" \
  "setuptools>=68" wheel
# the project without its dependencies: its torch range must not replace the torch just installed.
# Skipped when the venv already imports this checkout's hal (a rerun: no rebuild of the C++ fabric).
if [ "$(cd / && "$VENV/bin/python" -c 'import hal, os; print(os.path.dirname(os.path.dirname(hal.__file__)))' \
        2>/dev/null)" != "$ROOT" ]; then
  "$VENV/bin/pip" install -q --no-deps --no-build-isolation -e "$ROOT"
fi
echo "oldest_torch.sh: install took $(( $(date +%s) - start )) s; torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
cd "$ROOT"
# The core's tests: plugins and their stand-ins, the contract and manager, emulation, ops, the bridge,
# the conformance suite, and the compat layer itself. Not the strategies/trainer/planner (they use
# FSDP2 and DTensor through compat, but their tests are the newest torch's).
CORE_TESTS=(tests/test_torch_compat.py tests/test_plugin_manager.py tests/test_plugin_sdk.py
  tests/test_plugin_cpu.py tests/test_plugin_cuda.py tests/test_plugin_ascend.py tests/test_plugin_kunlun.py
  tests/test_accelerator.py tests/test_runtime.py tests/test_emulation.py tests/test_ops.py tests/test_catalog.py
  tests/test_cluster.py tests/test_topology.py tests/test_gloo_group.py tests/test_bridge_collectives.py
  tests/test_bridge_topology.py tests/test_bridge_faults.py tests/test_hetero_destroy.py
  tests/test_conformance_plugins.py tests/test_conformance_addon.py tests/test_hook_table.py tests/test_envs.py)
present=()
for t in "${CORE_TESTS[@]}"; do [ -f "$t" ] && present+=("$t"); done
t0=$(date +%s)
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "${present[@]}" "$@"
echo "oldest_torch.sh: core tests on torch $VERSION took $(( $(date +%s) - t0 )) s"
