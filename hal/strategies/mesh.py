"""The process groups a Plan needs, built from the `hetero` world: TP, per-stage DP (and EP), and the
pipeline's row-range transfers between neighbouring stages.

How the layout is represented, and why not one rectangular DeviceMesh
-------------------------------------------------------------------
torch's DeviceMesh is an n-d array of ranks: every pipeline stage would need the same DP and TP
degree. A plan for a mixed cluster breaks that on purpose (3 H100 ranks run stage 0 as 3 DP replicas,
1 910B runs stage 1 alone; or stage 0 is TP=2 on one sub-cluster and stage 1 TP=1 on another), so the
layout here is a *list of rectangles*, one per stage:

    StageGrid(stage s).ranks[j][t]  = global rank of DP replica j, TP index t of stage s
                                      (shape dp_s x tp_s; dp_s and tp_s may differ from stage to stage)
    StageGrid(stage s).rows[j]      = [start, end) rows of every micro-batch that replica j processes

Inside one stage every replica has the same TP degree (Plan.check enforces it), so a stage *is*
rectangular and gets a true 2-D DeviceMesh ("dp", "tp") via DeviceMesh.from_group over the groups
built here (that is what FSDP2 and DTensor TP need, and FSDP2 insists the DP and TP meshes share one
parent). Between stages nothing is rectangular: activations move by point-to-point sends of row
ranges (`Transfer`), as FlagScale's heterogeneous pipeline does, not by a mesh dimension.

TP index t of a rank = its position in replica.ranks, which must ascend: torch orders a group by
global rank, so DTensor shard t lives on the t-th smallest rank, and the DP group of TP index t must
join ranks holding the same shard. Between stages of different TP
degree, TP index t of one stage exchanges with TP index t mod tp of the other ("peer rule").

MoE stages: the EP groups of TP index t are blocks of `ep` consecutive members of its DP group
(ep = dp unless the stage sets `ep`: one EP group, the DP group itself), and expert-DP group i is
member i of every block (hal/strategies/plan.py defines both; expert_parallel.py says why).

Every `dist.new_group` is called by every rank in the same order (stages in order; in each stage TP
groups by replica, then DP groups by TP index, then EP groups and expert-DP groups by TP index when
ep < dp), deduplicated by rank set, as torch requires.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

from hal.contract.errors import HalError
from hal.strategies.schedule import ORDERED_SCHEDULES


class MeshError(HalError, ValueError):
    """A plan's layout cannot be turned into process groups (names the stage, replica and ranks)."""


@dataclass(frozen=True)
class StageRole:
    """What one rank does for one pipeline stage."""

    stage: int
    replica: int
    tp_index: int
    rows: tuple[int, int]  # [start, end) of every micro-batch


@dataclass(frozen=True)
class Transfer:
    """Rows [start, end) of a micro-batch that `src` sends to `dst` across a stage boundary (global
    micro-batch row numbers; the sender's and receiver's local offsets follow from their own rows)."""

    src: int
    dst: int
    start: int
    end: int


@dataclass
class StageGrid:
    """One pipeline stage's rectangle of ranks: ranks[j][t] for DP replica j, TP index t."""

    index: int
    layers: tuple[int, int]
    ranks: list[list[int]]
    rows: list[tuple[int, int]]
    experts: Optional[list[list[int]]] = None
    ep: Optional[int] = None                              # replicas per EP group (None: dp)
    tp_groups: list[Any] = field(default_factory=list)   # one per replica
    dp_groups: list[Any] = field(default_factory=list)   # one per TP index
    ep_groups: dict = field(default_factory=dict)         # (TP index, EP group index) -> group, ep < dp
    expert_dp_groups: dict = field(default_factory=dict)  # (TP index, EP index) -> group, ep < dp

    @property
    def dp(self) -> int:
        return len(self.ranks)

    @property
    def tp(self) -> int:
        return len(self.ranks[0])

    @property
    def all_ranks(self) -> list[int]:
        return [r for rep in self.ranks for r in rep]

    def dp_ranks(self, t: int) -> list[int]:
        return [rep[t] for rep in self.ranks]

    @property
    def ep_degree(self) -> int:
        return self.ep if self.ep is not None else self.dp

    def ep_ranks(self, t: int, g: int) -> list[int]:
        """EP group g of TP index t: DP members [g * ep, (g + 1) * ep)."""
        e = self.ep_degree
        return self.dp_ranks(t)[g * e:(g + 1) * e]

    def expert_dp_ranks(self, t: int, i: int) -> list[int]:
        """Expert-DP group i of TP index t: EP index i of every EP group."""
        return self.dp_ranks(t)[i::self.ep_degree]


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> Optional[tuple[int, int]]:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if lo < hi else None


def grids_from_plan(plan: Any) -> list[StageGrid]:
    """The per-stage rectangles of a hal.strategies.plan.Plan (whose own validators already hold every
    stage to one micro-batch size and one TP degree). Makes no process group."""
    grids = []
    for s, st in enumerate(plan.stages):
        ranks = [list(rep.ranks) for rep in st.replicas]
        for j, rep in enumerate(ranks):
            if rep != sorted(rep):  # DTensor puts shard t on the t-th smallest rank of the TP group
                raise MeshError(f"stages[{s}].replicas[{j}].ranks = {rep}: TP ranks must ascend, so that "
                                f"TP index t (the DP group it joins) is the rank holding TP shard t")
        rows = [tuple(plan.rows(s, j)) for j in range(len(st.replicas))]
        experts = getattr(st, "experts", None)
        ep = getattr(st, "ep", None) if experts else None
        if ep is not None and (ep < 1 or len(ranks) % ep):
            raise MeshError(f"stages[{s}].ep = {ep}: must divide the stage's {len(ranks)} replicas "
                            f"({len(ranks)} % {ep} = {len(ranks) % ep if ep > 0 else 'n/a'})")
        grids.append(StageGrid(s, tuple(st.layers), ranks, rows,
                               [list(e) for e in experts] if experts else None, ep))
    return grids


def _transfers(src: StageGrid, dst: StageGrid) -> list[Transfer]:
    """Rows from grid src to grid dst: every receiver (replica k, TP index t) of dst gets, from TP index
    t mod tp_src of every replica of src whose rows overlap k's, the overlap; by receiver, then sender."""
    out = []
    for k, rep_dst in enumerate(dst.ranks):
        for t, to in enumerate(rep_dst):
            for j, rep_src in enumerate(src.ranks):
                ov = _overlap(src.rows[j], dst.rows[k])
                if ov:
                    out.append(Transfer(rep_src[t % src.tp], to, *ov))
    return out


def forward_transfers(a: StageGrid, b: StageGrid) -> list[Transfer]:
    """Activation rows from stage a to the next stage b: every receiver (replica k, TP index t) of b
    gets, from TP index t mod tp_a of every replica of a whose rows overlap k's, the overlap."""
    return _transfers(a, b)


def backward_transfers(a: StageGrid, b: StageGrid) -> list[Transfer]:
    """Gradient rows from stage b back to stage a: every receiver (replica j, TP index t) of a gets,
    from TP index t mod tp_b of every replica of b whose rows overlap j's, the overlap (the same rows
    the activations came by; each TP rank of a needs the full gradient of its output)."""
    return _transfers(b, a)


class HeteroMesh:
    """Every group a Plan needs, for this rank; construct it on every rank of the world (collective)."""

    def __init__(self, plan: Any, group: Optional[dist.ProcessGroup] = None,
                 timeout: Optional[timedelta] = None, device_type: Optional[str] = None) -> None:
        self.plan = plan
        self.grids = grids_from_plan(plan)
        if device_type is None:
            import hal
            device_type = hal.accelerator().device_type
        self.device_type = device_type
        self.world = group or dist.group.WORLD
        self.rank = dist.get_rank()
        world_size = dist.get_world_size(self.world)
        used = sorted({r for g in self.grids for r in g.all_ranks})
        bad = [r for r in used if not 0 <= r < world_size]
        if bad:
            raise MeshError(f"plan uses ranks {bad} outside the world of {world_size} ranks")
        self._cache: dict[tuple[int, ...], Any] = {}
        self._meshes: dict[int, Any] = {}
        for g in self.grids:  # same order on every rank: TP groups by replica, then DP groups by TP index
            g.tp_groups = [self._group(rep, timeout) for rep in g.ranks]
            g.dp_groups = [self._group(g.dp_ranks(t), timeout) for t in range(g.tp)]
            if g.experts is not None and g.ep_degree < g.dp:
                e = g.ep_degree
                g.ep_groups = {(t, k): self._group(g.ep_ranks(t, k), timeout)
                               for t in range(g.tp) for k in range(g.dp // e)}
                g.expert_dp_groups = {(t, i): self._group(g.expert_dp_ranks(t, i), timeout)
                                      for t in range(g.tp) for i in range(e)}
        self.roles = [self._role(g) for g in self.grids if self.rank in g.all_ranks]

    def _group(self, ranks: Sequence[int], timeout: Optional[timedelta]):
        key = tuple(sorted(ranks))
        if key not in self._cache:
            self._cache[key] = dist.new_group(list(key), timeout=timeout)
        return self._cache[key]

    def _role(self, g: StageGrid) -> StageRole:
        for j, rep in enumerate(g.ranks):
            if self.rank in rep:
                return StageRole(g.index, j, rep.index(self.rank), g.rows[j])
        raise AssertionError("unreachable")

    # ---- lookups ----------------------------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return len(self.grids)

    @property
    def microbatch_size(self) -> int:
        return self.grids[0].rows[-1][1]

    def role(self, stage: Optional[int] = None) -> StageRole:
        """This rank's role in `stage` (default: its only stage)."""
        mine = [r for r in self.roles if stage is None or r.stage == stage]
        if len(mine) != 1:
            raise MeshError(f"rank {self.rank}: {len(mine)} roles for stage={stage} "
                            f"(stages held: {[r.stage for r in self.roles]})")
        return mine[0]

    def tp_group(self, stage: int):
        r = self.role(stage)
        return self.grids[stage].tp_groups[r.replica]

    def dp_group(self, stage: int):
        r = self.role(stage)
        return self.grids[stage].dp_groups[r.tp_index]

    def ep_group(self, stage: int):
        """This rank's EP group: its block of ep consecutive DP members at its TP index (the DP group
        itself when ep = dp), when the stage has experts."""
        g = self.grids[stage]
        if g.experts is None:
            raise MeshError(f"stages[{stage}] has no experts, so no EP group")
        if g.ep_degree == g.dp:
            return self.dp_group(stage)
        r = self.role(stage)
        return g.ep_groups[(r.tp_index, r.replica // g.ep_degree)]

    def expert_dp_group(self, stage: int):
        """This rank's expert-DP group (the ranks holding its experts, one per EP group), or None when
        the stage has one EP group (each expert lives once: nothing to reduce)."""
        g = self.grids[stage]
        if g.experts is None or g.ep_degree == g.dp:
            return None
        r = self.role(stage)
        return g.expert_dp_groups[(r.tp_index, r.replica % g.ep_degree)]

    def device_mesh(self, stage: int):
        """The stage's 2-D DeviceMesh ("dp", "tp") over the groups built here (no new group)."""
        if stage not in self._meshes:
            from torch.distributed.device_mesh import DeviceMesh
            g = self.grids[stage]
            role = self.role(stage)
            mesh = torch.tensor(g.ranks, dtype=torch.int)  # (dp, tp)
            for t in range(g.tp):  # DTensor's coordinate must equal the rank inside each group
                col = mesh[:, t].tolist()
                if col != sorted(col):
                    raise MeshError(f"stages[{stage}]: DP ranks at TP index {t} are {col}, not ascending "
                                    f"in replica order; order the replicas so the DP ranks ascend")
            self._meshes[stage] = DeviceMesh.from_group(
                [g.dp_groups[role.tp_index], g.tp_groups[role.replica]], self.device_type,
                mesh=mesh, mesh_dim_names=("dp", "tp"))
        return self._meshes[stage]

    # ---- pipeline neighbours ------------------------------------------------------------------------
    def transfers(self, boundary: int) -> list[Transfer]:
        """Forward sends across the boundary between stages `boundary` and `boundary + 1`."""
        return forward_transfers(self.grids[boundary], self.grids[boundary + 1])

    def grad_transfers(self, boundary: int) -> list[Transfer]:
        """Backward (gradient) sends across the boundary, from stage `boundary + 1` to `boundary`."""
        return backward_transfers(self.grids[boundary], self.grids[boundary + 1])

    def chains(self) -> Optional[list[list[int]]]:
        """The rank chains torch's own pipelining schedules can run on, or None.

        A chain exists when every stage has the same DP and TP degree and the same row ranges, so
        replica j, TP index t of every stage form one pipeline; chain[j * tp + t] = its ranks in stage
        order (a rank repeats when it hosts several stages, as interleaved schedules need)."""
        g0 = self.grids[0]
        for g in self.grids[1:]:
            if g.dp != g0.dp or g.tp != g0.tp or g.rows != g0.rows:
                return None
        return [[g.ranks[j][t] for g in self.grids] for j in range(g0.dp) for t in range(g0.tp)]

    def chain_group(self, timeout: Optional[timedelta] = None) -> Optional[tuple[list[int], Any]]:
        """(this rank's chain in stage order, its process group) for torch's schedules, or None on a rank
        in no chain. Creates every chain's group, so every rank of the world must call it (idle ones too),
        in the same order. MeshError when the layout has no equal chains."""
        chains = self.chains()
        if chains is None:
            raise MeshError("the plan's stages differ in DP/TP degree or row ranges, so there are no equal "
                            "chains for torch's schedules; use the hetero runtime "
                            f"({' or '.join(ORDERED_SCHEDULES)})")
        mine = None
        for chain in chains:
            grp = self._group(sorted(set(chain)), timeout)
            if self.rank in chain:
                mine = (chain, grp)
        return mine

    def describe(self) -> str:
        """A plain-text picture of the layout (one line per stage)."""
        lines = []
        for g in self.grids:
            reps = "  ".join(f"r{j}{g.ranks[j]} rows {g.rows[j][0]}:{g.rows[j][1]}" for j in range(g.dp))
            lines.append(f"stage {g.index} layers {g.layers[0]}:{g.layers[1]} dp={g.dp} tp={g.tp}: {reps}")
        return "\n".join(lines)
