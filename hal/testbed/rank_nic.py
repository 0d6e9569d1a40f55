"""torchrun entry point that binds this rank's gloo traffic to its own NIC, then runs the real target.

    torchrun ... -m hal.testbed.rank_nic -m hal.cli.bench comm ...     # a module
    torchrun ... -m hal.testbed.rank_nic train.py --lr 1e-3                   # a script

torchrun gives every local rank the same environment, but on a rail-optimized host local rank i owns
NIC i. This sets `GLOO_SOCKET_IFNAME` to the i-th name of `HAL_RANK_NICS` (comma-separated, indexed
by LOCAL_RANK; e.g. `rail0,rail1` in the test bed, `eth2,eth3,...` on a real node) before torch is
imported. torch 2.13 reads GLOO_SOCKET_IFNAME in the `ProcessGroupGloo(store, rank, size, timeout)`
constructor the bridge uses for its global group and rails (torch/csrc/distributed/c10d/init.cpp:
`createDeviceForInterface` per name, else `createDefaultDevice` from the hostname), and in
`new_group(backend="gloo")`: every gloo socket of the rank then listens on that NIC's address, and
the host's source-address routing (hal.testbed.bed) sends what it originates from that address out of
that NIC. Without HAL_RANK_NICS it changes nothing. The target runs through
hal.launch.check.run_target, which reports an uncaught error as one marked line for the launcher.
"""
from __future__ import annotations

import os
import sys

from hal import envs


def nic_for_local_rank(nics: str, local_rank: int) -> str:
    names = [n.strip() for n in nics.split(",") if n.strip()]
    if not 0 <= local_rank < len(names):
        raise SystemExit(f"hal.testbed.rank_nic: LOCAL_RANK={local_rank} but HAL_RANK_NICS={nics!r} names "
                         f"{len(names)} NIC(s); give one per local rank")
    return names[local_rank]


def main(argv: list[str]) -> None:
    nics = envs.HAL_RANK_NICS.text()
    if nics:
        os.environ["GLOO_SOCKET_IFNAME"] = nic_for_local_rank(nics, int(os.environ.get("LOCAL_RANK", "0")))
    if not argv:
        raise SystemExit("usage: python -m hal.testbed.rank_nic (-m MODULE | SCRIPT) [ARGS...]")
    if argv[0] == "-m" and len(argv) < 2:
        raise SystemExit("hal.testbed.rank_nic: -m needs a module name")
    # the target runs as __main__; an uncaught error is one marked line first, so `hal testbed run`
    # prints the first failing rank's error once (hal.launch.check)
    from hal.launch.check import run_target
    run_target(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
