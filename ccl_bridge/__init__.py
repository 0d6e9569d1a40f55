"""ccl_bridge: the `hetero` torch.distributed backend that links sub-clusters of different chips.

(Full description: docs/bridge.md.) `import ccl_bridge` registers the backend; then on every rank

    dist.init_process_group("hetero")          # or dist.new_group(ranks, backend="hetero")

gives one process group over all chips of a mixed cluster.
"""
from .backend import create, local_identity, register
from .config import BridgeConfig
from .errors import (BridgeCollectiveError, BridgeConfigError, BridgeError, BridgeMismatchError,
                     BridgePeerError, BridgeTimeoutError)
from .process_group import HeteroProcessGroup
from .topology import RankIdentity, Topology, build_topology

register()

__all__ = ["BridgeConfig", "BridgeCollectiveError", "BridgeConfigError", "BridgeError", "BridgeMismatchError",
           "BridgePeerError", "BridgeTimeoutError", "HeteroProcessGroup", "RankIdentity", "Topology",
           "build_topology", "create", "local_identity", "register"]
