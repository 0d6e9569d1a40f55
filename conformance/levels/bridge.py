"""Level `bridge`: the plugin's chip and the `cpu` reference chip in one `hetero` cluster.

Placeholder until `ccl_bridge` provides the `hetero` backend: every check is skipped with the
reason "ccl_bridge not available".
"""
from __future__ import annotations

from ..checks import Check, CheckSkipped


def check_unavailable(ctx) -> str:
    raise CheckSkipped("ccl_bridge not available")


def discover(target) -> list[Check]:
    return [Check("bridge.hetero_cluster", "bridge", "the chip and cpu form one hetero process group",
                  check_unavailable, where="local")]
