"""Where this node stands in a multi-node `hal train`, the nodes' agreement before launch, and the
check that the checkpoint folder is shared.

Which node am I (`resolve`), first match wins:
1. the flags `--nnodes N --node-rank R --rdzv-endpoint HOST[:PORT]` (torchrun's meaning);
2. Slurm, when `hal train` runs once per node under `srun` (SLURM_NNODES > 1): node rank SLURM_NODEID,
   endpoint MASTER_ADDR[:MASTER_PORT] when set, else the first host of SLURM_JOB_NODELIST
   (`first_host` expands the simple forms `a,b`, `node[01-04,07]`; `scontrol show hostnames` is
   not called);
3. the config's `cluster.nodes = ["host0", "host1", ...]`: this node is the entry equal to its host
   name, the first entry is the endpoint;
else one node. The endpoint's port defaults to DEFAULT_PORT (torchrun's c10d default).

torchrun is started with the static rendezvous on the endpoint (`--master-addr/--master-port` with
`--node-rank`), so node R holds the global ranks after nodes 0..R-1: the order the chip map
(cluster.emulate, a cluster spec) gives every rank.

Before torchrun starts, every node runs the pre-launch checks and `agree` exchanges the results over a
torch TCPStore on the endpoint's port + 1 (node 0 serves it, for as long as its `hal train` runs, so a
node killed mid-run and started again with the same command passes its checks and joins the restarted
job: hal.trainer.elastic.init_process_group): a node whose check failed stops every
node with its one line, named by node and host; a node that never reports stops the others after
`timeout_s`. `check_shared_dir` (every rank, after the process group is up): rank 0 writes a marker
with a random nonce into the checkpoint folder, each node's local rank 0 must read it within a bounded
wait; a node that cannot is named in one line on every rank (SharedFolderError).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Mapping, Optional, Sequence

from hal.contract.errors import HalError
from hal.launch.check import LaunchError, check_int

DEFAULT_PORT = 29400
AGREE_PORT_OFFSET = 1  # the pre-launch agreement's store: endpoint port + 1
_SERVED: list = []  # node 0's agreement store, served for the launcher's life (a node started again joins it)


class SharedFolderError(HalError):
    """The checkpoint folder is not the same folder on every node; the message names the node."""


@dataclass(frozen=True)
class NodeLaunch:
    nnodes: int
    node_rank: int
    addr: str
    port: int
    source: str  # where it came from, for messages: "--nnodes/--node-rank/--rdzv-endpoint", "Slurm", ...

    @property
    def multi(self) -> bool:
        return self.nnodes > 1

    def torchrun_args(self) -> list[str]:
        return ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank),
                "--master-addr", self.addr, "--master-port", str(self.port)]


def split_endpoint(flag: str, text: str) -> tuple[str, int]:
    """(host, port) of 'HOST[:PORT]' (IPv6 as '[addr]:port'); LaunchError naming `flag` if malformed."""
    m = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?|([^:\[\]]+)(?::(\d+))?", text.strip())
    if not m:
        raise LaunchError(f"{flag} {text!r}: expected HOST or HOST:PORT")
    host, port = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    return host, check_int(f"{flag} {text} (port)", int(port), 1, 65534) if port else DEFAULT_PORT


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: 'a,b' -> 'a'; 'node[01-04,07],x' -> 'node01'; 'gpu-[3-5]'
    -> 'gpu-3'. LaunchError for a list it cannot read (then set MASTER_ADDR)."""
    m = re.match(r"\s*([^,\[\s]+)(?:\[([^\]]+)\])?([^,\s]*)", nodelist)
    if not m or not m.group(1):
        raise LaunchError(f"SLURM_JOB_NODELIST={nodelist!r}: cannot read its first host; set MASTER_ADDR")
    prefix, ranges, suffix = m.groups()
    if not ranges:
        return prefix + suffix
    first = ranges.split(",")[0].split("-")[0]
    if not first.isdigit():
        raise LaunchError(f"SLURM_JOB_NODELIST={nodelist!r}: cannot read its first host; set MASTER_ADDR")
    return prefix + first + suffix


def _slurm(env: Mapping[str, str]) -> Optional[NodeLaunch]:
    try:
        nnodes = int(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES") or 0)
    except ValueError:
        raise LaunchError(f"SLURM_NNODES={env.get('SLURM_NNODES')!r}: not an integer") from None
    if nnodes <= 1 or "SLURM_NODEID" not in env:
        return None
    try:
        node, ntasks = int(env["SLURM_NODEID"]), int(env.get("SLURM_NTASKS") or nnodes)
    except ValueError:
        raise LaunchError(f"SLURM_NODEID={env['SLURM_NODEID']!r} / SLURM_NTASKS={env.get('SLURM_NTASKS')!r}: "
                          f"not integers") from None
    if ntasks != nnodes or int(env.get("SLURM_PROCID", node)) != node:
        raise LaunchError(f"Slurm: SLURM_NTASKS={ntasks} on SLURM_NNODES={nnodes} (SLURM_PROCID="
                          f"{env.get('SLURM_PROCID')}, SLURM_NODEID={node}): run one `hal train` per node "
                          f"(srun --ntasks-per-node=1); it starts the node's ranks itself")
    if env.get("MASTER_ADDR"):
        addr, where = env["MASTER_ADDR"], "MASTER_ADDR"
    else:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        addr, where = first_host(nodelist), "SLURM_JOB_NODELIST's first host"
    port = check_int(f"MASTER_PORT={env.get('MASTER_PORT')}", int(env["MASTER_PORT"]), 1, 65534) \
        if (env.get("MASTER_PORT") or "").isdigit() else DEFAULT_PORT
    check_int(f"SLURM_NODEID {node} (of SLURM_NNODES {nnodes})", node, 0, nnodes - 1)
    return NodeLaunch(nnodes, node, addr, port, f"Slurm (SLURM_NODEID, SLURM_NNODES, endpoint from {where})")


def resolve(nnodes: Optional[int], node_rank: Optional[int], endpoint: Optional[str],
            nodes: Sequence[str], env: Mapping[str, str], hostname: Optional[str] = None) -> NodeLaunch:
    """This node's place (module doc: flags, then Slurm, then cluster.nodes, else one node)."""
    if nnodes is not None or node_rank is not None or endpoint is not None:
        flags = "--nnodes/--node-rank/--rdzv-endpoint"
        n = check_int("--nnodes", 1 if nnodes is None else nnodes, 1, 4096)
        if n > 1 and (node_rank is None or endpoint is None):
            raise LaunchError(f"--nnodes {n}: also give --node-rank (this node's index, 0..{n - 1}) and "
                              f"--rdzv-endpoint HOST[:PORT] (node 0's address), the same on every node")
        r = check_int(f"--node-rank {node_rank} (of --nnodes {n})", node_rank or 0, 0, n - 1)
        addr, port = split_endpoint("--rdzv-endpoint", endpoint) if endpoint else ("127.0.0.1", DEFAULT_PORT)
        return NodeLaunch(n, r, addr, port, flags)
    slurm = _slurm(env)
    if slurm is not None:
        return slurm
    if len(nodes) > 1:
        me = hostname or socket.gethostname()
        names = [split_endpoint("cluster.nodes", x)[0] for x in nodes]
        short = [n.split(".")[0] for n in names]
        idx = names.index(me) if me in names else (short.index(me.split(".")[0]) if me.split(".")[0] in short
                                                    else None)
        if idx is None:
            raise LaunchError(f"cluster.nodes = {list(nodes)}: this host {me!r} is not in the list; run `hal "
                              f"train` on those hosts, or pass --nnodes/--node-rank/--rdzv-endpoint")
        addr, port = split_endpoint("cluster.nodes", nodes[0])
        return NodeLaunch(len(nodes), idx, addr, port, f"cluster.nodes (this host {me!r})")
    return NodeLaunch(1, 0, "127.0.0.1", 0, "one node")


def ranks_on_node(world: int, node: NodeLaunch, cluster_spec=None) -> int:
    """Ranks node `node.node_rank` starts: a cluster spec's count for that node, else world / nnodes."""
    return len(node_ranks(world, node, cluster_spec))


def node_ranks(world: int, node: NodeLaunch, cluster_spec=None) -> range:
    """The global ranks node `node.node_rank` starts, as torchrun's static rendezvous numbers them: the
    ranks after those of nodes 0..R-1, as many as the cluster spec puts on node R (when its node count is
    the job's), else world / nnodes (LaunchError when that does not divide)."""
    if cluster_spec is not None and cluster_spec.num_nodes == node.nnodes:
        count = [0] * node.nnodes
        for r in range(world):
            count[cluster_spec.assignment(r).node] += 1
        first = sum(count[:node.node_rank])
        return range(first, first + count[node.node_rank])
    if world % node.nnodes:
        raise LaunchError(f"{world} ranks do not split evenly over {node.nnodes} nodes ({node.source}); give "
                          f"a cluster spec (cluster.spec) whose nodes say how many ranks each holds")
    per = world // node.nnodes
    return range(node.node_rank * per, (node.node_rank + 1) * per)


def local_ranks_of(node: NodeLaunch):
    """For `hal.launch.check.plan_ranks(local_ranks=...)`: (world, env) -> the ranks this node starts
    (a cluster spec in env's HAL_CLUSTER gives the per-node counts unless HAL_EMULATE maps the chips)."""
    def local(world: int, env: Mapping[str, str]) -> range:
        spec = None
        if env.get("HAL_CLUSTER") and not env.get("HAL_EMULATE"):
            from hal.core.cluster import load_cluster_spec
            spec = load_cluster_spec(env["HAL_CLUSTER"])
        return node_ranks(world, node, spec)
    return local


# ---- the nodes' agreement before launch ------------------------------------------------------------
def agree(node: NodeLaunch, problem: Optional[str], timeout_s: float) -> None:
    """Exchange every node's pre-launch result (None: ok; else its one-line problem) over a TCPStore on
    the endpoint's port + 1; LaunchError on every node when one failed or did not report in time."""
    import torch.distributed as dist
    port = node.port + AGREE_PORT_OFFSET
    where = f"{node.addr}:{port}"
    try:
        store = dist.TCPStore(node.addr, port, node.nnodes, node.node_rank == 0,
                              timedelta(seconds=timeout_s), wait_for_workers=False)
    except (RuntimeError, OSError, TimeoutError) as exc:
        raise LaunchError(f"node {node.node_rank} of {node.nnodes}: cannot reach the pre-launch store at {where} "
                          f"within {timeout_s:g} s ({node.source}): {' '.join(str(exc).split())[:200]}") from None
    me = {"host": socket.gethostname(), "problem": problem}
    store.set(f"hal/check/{node.node_rank}", json.dumps(me))
    keys = [f"hal/check/{i}" for i in range(node.nnodes)]
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [i for i, k in enumerate(keys) if not store.check([k])]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    results = {i: json.loads(store.get(k)) for i, k in enumerate(keys) if i not in missing}
    store.set(f"hal/read/{node.node_rank}", "1")
    if node.node_rank == 0:  # serve the store until every node that reported has read it (bounded)
        _SERVED.append(store)  # and on: a node whose `hal train` is started again mid-run agrees with it
        readers = [f"hal/read/{i}" for i in results]
        end = time.monotonic() + 5
        while time.monotonic() < end and not store.check(readers):
            time.sleep(0.1)
    bad = [(i, r) for i, r in sorted(results.items()) if r["problem"]]
    if bad:
        i, r = bad[0]
        raise LaunchError(f"node {i} ({r['host']}): {r['problem']}")
    if missing:
        raise LaunchError(f"node(s) {missing} of {node.nnodes} did not report their pre-launch checks within "
                          f"{timeout_s:g} s (store {where}, {node.source}); is `hal train` running there with "
                          f"the same nodes and endpoint?")


# ---- the checkpoint folder is shared ------------------------------------------------------------
def sees_marker(path: Path, nonce: str, timeout_s: float, poll_s: float = 0.2) -> bool:
    """The marker file holds `nonce` within `timeout_s` (a shared file system may show it late)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if json.loads(path.read_text()).get("nonce") == nonce:
                return True
        except (OSError, ValueError, AttributeError):
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def check_shared_dir(folder: Path, group, timeout_s: float = 60.0, field: str = "checkpoint.dir") -> None:
    """Every node sees the folder rank 0 writes into (multi-node runs only; a no-op on one node), each
    waiting at most min(timeout_s, HAL_SHARED_DIR_WAIT_S). Collective over `group` (every rank calls
    it); SharedFolderError on every rank naming the node."""
    import torch.distributed as dist

    from hal import envs
    world = dist.get_world_size(group)
    if int(os.environ.get("LOCAL_WORLD_SIZE", world)) >= world:
        return
    timeout_s = min(timeout_s, envs.HAL_SHARED_DIR_WAIT_S.get())
    box: list = [None]
    if dist.get_rank(group) == 0:
        Path(folder).mkdir(parents=True, exist_ok=True)
        box[0] = {"nonce": secrets.token_hex(16), "host": socket.gethostname()}
        (Path(folder) / f".hal-shared-{box[0]['nonce']}").write_text(json.dumps(box[0]))
    dist.broadcast_object_list(box, src=0, group=group)
    marker = Path(folder) / f".hal-shared-{box[0]['nonce']}"
    mine = None
    if int(os.environ.get("LOCAL_RANK", "0")) == 0 and not sees_marker(marker, box[0]["nonce"], timeout_s):
        mine = (f"{field} {folder}: node {os.environ.get('GROUP_RANK', '?')} ({socket.gethostname()}) cannot see "
                f"the marker {marker.name} that rank 0 wrote on {box[0]['host']} within {timeout_s:g} s: the "
                f"folder must be one shared folder (NFS, Lustre, ...) on every node")
    every: list = [None] * world
    dist.all_gather_object(every, mine, group=group)
    if dist.get_rank(group) == 0:
        marker.unlink(missing_ok=True)
    bad = [m for m in every if m]
    if bad:
        raise SharedFolderError(bad[0])
