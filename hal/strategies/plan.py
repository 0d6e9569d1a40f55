"""`Plan`: how one model is laid out over a (mixed) cluster - the contract between the planner, which
writes it, and `apply_plan` / the trainer, which run it.

A plan is a list of pipeline stages in order. Each stage owns a contiguous range of decoder blocks
and a list of data-parallel replicas; each replica is one tensor-parallel group (its `ranks`) and
processes `microbatch` rows of every micro-batch (rows may differ by chip: a faster chip takes
more). The mesh is not rectangular: the DP degree may differ between stages and the TP degree
between stages. Derived groups (one definition, used by hal/strategies/mesh.py):
  TP group          = replica.ranks
  DP group (s, t)   = [r.ranks[t] for r in stages[s].replicas]   (equal TP degree inside a stage)
  EP groups (s, t)  = the DP group cut into blocks of `stages[s].ep` consecutive members (default
                      ep = dp: one EP group), when stages[s].experts is set; each block hosts every
                      expert once, with the same placement (experts[j] == experts[j % ep])
  expert-DP (s, t, i) = [DP group[g * ep + i] for every block g]: the copies of EP index i's experts,
                      whose gradients are SUM-reduced there (Megatron-LM / DeepSpeed "expert data
                      parallel"); one member when ep = dp
  rows of replica j = a contiguous range of each micro-batch, replicas in order (`Plan.rows`)
Every rank runs the same number of micro-batches per step (`num_microbatches`), so the collectives
of every group stay matched whatever the row split.

Plans round-trip through TOML (`to_toml` / `from_toml`) and JSON (`to_json` / `from_json`); every
construction error is a `PlanError` naming the field path and value. `Plan.check(topology, model)`
rejects what cannot run on that cluster and model, with the numbers in the message.
"""
from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal, Mapping, NamedTuple, Optional, Sequence, Union

from pydantic import ConfigDict, Field, field_validator, model_validator

from .errors import FieldErrorModel, PlanError
from .schedule import MULTI_STAGE_SCHEDULES, Schedule

__all__ = ["Plan", "Stage", "Replica", "Role", "PlanError", "PLAN_VERSION"]

PLAN_VERSION = 1


class _Model(FieldErrorModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    field_error = PlanError


class Replica(_Model):
    """One data-parallel replica of a stage: a tensor-parallel group and its share of each micro-batch."""

    ranks: list[int] = Field(min_length=1, description="global ranks of its TP group (tp degree = len)")
    microbatch: int = Field(ge=1, description="rows (samples) of each micro-batch it processes")

    @field_validator("ranks")
    @classmethod
    def _ranks(cls, v: list[int]) -> list[int]:
        neg = [r for r in v if r < 0]
        if neg:
            raise ValueError(f"ranks must be >= 0, got {neg}")
        dup = sorted({r for r in v if v.count(r) > 1})
        if dup:
            raise ValueError(f"rank(s) {dup} listed twice in one TP group")
        return v

    @property
    def tp(self) -> int:
        return len(self.ranks)


class Stage(_Model):
    """One pipeline stage: decoder blocks [start, end), its DP replicas, recompute, expert placement.

    Stage 0 also holds the token embedding; the last stage the final norm and the output head."""

    layers: tuple[int, int] = Field(description="[start, end) decoder block indices")
    replicas: list[Replica] = Field(min_length=1)
    recompute: Literal["none", "selective", "full"] = "none"   # selective: the attention core only
    experts: Optional[list[list[int]]] = Field(
        default=None, description="MoE: expert ids hosted by each replica (EP over the replicas)")
    ep: Optional[int] = Field(default=None, ge=1, description="MoE: EP degree; replicas form EP groups of ep "
                              "consecutive replicas, each hosting every expert once (default: dp, one group)")

    @field_validator("layers")
    @classmethod
    def _layers(cls, v: tuple[int, int]) -> tuple[int, int]:
        start, end = v
        if start < 0:
            raise ValueError(f"layer range start must be >= 0, got [{start}, {end})")
        if end <= start:
            raise ValueError(f"a stage with no layers: [{start}, {end}) is empty (need end > start)")
        return v

    @property
    def tp(self) -> int:
        return self.replicas[0].tp

    @property
    def dp(self) -> int:
        return len(self.replicas)

    @property
    def microbatch_size(self) -> int:
        return sum(r.microbatch for r in self.replicas)

    @property
    def ranks(self) -> list[int]:
        return [rank for r in self.replicas for rank in r.ranks]

    @property
    def ep_degree(self) -> int:
        """Replicas per EP group (dp when `ep` is not set)."""
        return self.ep if self.ep is not None else self.dp

    @model_validator(mode="after")
    def _ep(self) -> "Stage":
        # degree arithmetic where the stage is built: ep needs experts, divides dp, and every EP group
        # repeats group 0's placement (so expert-DP group i = the i-th member of every group)
        if self.ep is None:
            return self
        dp = len(self.replicas)
        if self.experts is None:
            raise PlanError("ep", self.ep, "an EP degree needs an expert placement (experts = [...] per replica)")
        if dp % self.ep:
            raise PlanError("ep", self.ep, f"EP degree {self.ep} does not divide the stage's {dp} replicas "
                            f"({dp} % {self.ep} = {dp % self.ep}); EP groups are {self.ep} consecutive replicas")
        for j, ids in enumerate(self.experts):
            if j >= self.ep and j < dp and ids != self.experts[j % self.ep]:
                raise PlanError(f"experts[{j}]", ids, f"replica {j} is EP index {j % self.ep} of EP group "
                                f"{j // self.ep} (ep = {self.ep}); every EP group repeats group 0's placement, "
                                f"so it must host {self.experts[j % self.ep]}")
        return self


class Role(NamedTuple):
    """Where one rank sits: stage index, replica index inside the stage, index inside its TP group."""

    stage: int
    replica: int
    tp_index: int


class Plan(_Model):
    """A model's layout over a cluster. See the module docstring for the derived groups."""

    version: int = PLAN_VERSION
    model: str = Field(min_length=1, description="the model config's name")
    num_microbatches: int = Field(default=1, ge=1, description="micro-batches per step, equal on every rank")
    schedule: Schedule = Schedule.ONE_F_ONE_B
    zero: Literal[0, 2, 3] = Field(default=0, description="0: DDP all-reduce; 2: FSDP2 without "
                                   "reshard after forward; 3: FSDP2 fully_shard")
    stages: list[Stage] = Field(min_length=1, description="pipeline stages in order")

    @field_validator("version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != PLAN_VERSION:
            raise ValueError(f"plan version {v} is not supported (this code reads version {PLAN_VERSION})")
        return v

    @model_validator(mode="after")
    def _shape(self) -> "Plan":
        # shape rules that need no cluster or model: every stage takes the same micro-batch rows
        # (activations flow between stages row for row), every replica of a stage the same TP degree
        size0 = self.stages[0].microbatch_size
        for i, s in enumerate(self.stages):
            mbs = [r.microbatch for r in s.replicas]
            if sum(mbs) != size0:
                raise PlanError(f"stages[{i}].replicas", mbs, f"stage {i}'s micro-batch size {sum(mbs)} (sum of "
                                f"its replicas' microbatch) differs from stage 0's {size0}; every stage must "
                                f"process the same rows")
            tps = [r.tp for r in s.replicas]
            if len(set(tps)) > 1:
                raise PlanError(f"stages[{i}].replicas", [r.ranks for r in s.replicas], f"replicas have TP "
                                f"degrees {tps}; the DP group of each TP index needs one rank from every "
                                f"replica, so they must be equal")
        return self

    # ---- derived quantities --------------------------------------------------------------------
    @property
    def microbatch_size(self) -> int:
        """Rows of one micro-batch (the same for every stage)."""
        return self.stages[0].microbatch_size

    @property
    def global_batch(self) -> int:
        return self.microbatch_size * self.num_microbatches

    @property
    def ranks(self) -> list[int]:
        """Every rank the plan uses, sorted, without repeats."""
        return sorted({r for s in self.stages for r in s.ranks})

    def rows(self, stage: int, replica: int) -> tuple[int, int]:
        """[start, end) rows of every micro-batch that replica `replica` of stage `stage` processes."""
        reps = self.stages[stage].replicas
        start = sum(r.microbatch for r in reps[:replica])
        return start, start + reps[replica].microbatch

    def roles(self, rank: int) -> list[Role]:
        """Every (stage, replica, tp_index) `rank` holds (several under an interleaved schedule)."""
        return [Role(si, ri, r.ranks.index(rank)) for si, s in enumerate(self.stages)
                for ri, r in enumerate(s.replicas) if rank in r.ranks]

    def role(self, rank: int) -> Role:
        """The one role of `rank` (raises when it holds none or several stages)."""
        found = self.roles(rank)
        if len(found) != 1:
            raise PlanError("stages", f"rank {rank}", f"rank {rank} holds {len(found)} roles {found}; "
                            f"role() needs exactly one (use roles() under an interleaved schedule)")
        return found[0]

    def tp_ranks(self, stage: int, replica: int) -> list[int]:
        return list(self.stages[stage].replicas[replica].ranks)

    def dp_ranks(self, stage: int, tp_index: int = 0) -> list[int]:
        """The DP group of TP index `tp_index` in stage `stage` (with experts and ep = dp, the EP group)."""
        return [r.ranks[tp_index] for r in self.stages[stage].replicas]

    def ep_ranks(self, stage: int, tp_index: int = 0, replica: int = 0) -> list[int]:
        """The EP group (TP index `tp_index`) holding replica `replica` of stage `stage`: its block of
        `ep` consecutive DP members."""
        ep = self.stages[stage].ep_degree
        g = replica // ep
        return self.dp_ranks(stage, tp_index)[g * ep:(g + 1) * ep]

    def expert_dp_ranks(self, stage: int, tp_index: int = 0, ep_index: int = 0) -> list[int]:
        """The expert-DP group: EP index `ep_index` of every EP group (ranks holding the same experts,
        whose gradients are SUM-reduced together)."""
        ep = self.stages[stage].ep_degree
        return self.dp_ranks(stage, tp_index)[ep_index::ep]

    # ---- checks against a cluster and a model ------------------------------------------------
    def check(self, topology: Any, model_cfg: Any) -> "Plan":
        """Raise PlanError for what cannot run on `topology` (hal.core.topology.Topology) with `model_cfg`
        (hal.strategies.models.ModelConfig); return the plan otherwise."""
        _check(self, topology, model_cfg)
        return self

    # ---- constructors ------------------------------------------------------------------------
    @classmethod
    def even(cls, topology: Any, model_cfg: Any, global_batch: int, num_microbatches: int = 1,
             pp: int = 1, tp: int = 1, zero: int = 0, schedule: str = "1F1B", recompute: str = "none",
             ep: bool = False, stage_ranks: Optional[Sequence[Sequence[int]]] = None,
             check: bool = True, ep_degree: Optional[int] = None) -> "Plan":
        """The naive layout a homogeneous tool picks: ranks in order, `pp` equal stages of contiguous
        ranks, TP groups of `tp` contiguous ranks, equal layers per stage (earlier stages one more when
        uneven), equal rows per replica, experts split evenly over a stage's replicas when `ep`
        (over each EP group of `ep_degree` consecutive replicas when given: expert data parallel)."""
        return _build(cls, topology, model_cfg, global_batch, num_microbatches, pp, tp, zero, schedule,
                      recompute, ep, stage_ranks, None, False, check, ep_degree)

    @classmethod
    def weighted(cls, topology: Any, model_cfg: Any, global_batch: int, speeds: Mapping[str, float],
                 num_microbatches: int = 1, pp: int = 1, tp: int = 1, zero: int = 0,
                 schedule: str = "1F1B", recompute: str = "none", ep: bool = False,
                 stage_ranks: Optional[Sequence[Sequence[int]]] = None, weight_layers: bool = True,
                 check: bool = True, ep_degree: Optional[int] = None) -> "Plan":
        """`even`'s layout with work split by speed: `speeds` maps chip name -> relative speed; each
        replica's rows are proportional to speed x TP degree (at least 1), each stage's layers (when
        `weight_layers`) to its replicas' total speed, and experts (with `ep`) to replica speed (that of
        EP group 0's replicas, repeated in every group, with `ep_degree`)."""
        return _build(cls, topology, model_cfg, global_batch, num_microbatches, pp, tp, zero, schedule,
                      recompute, ep, stage_ranks, dict(speeds), weight_layers, check, ep_degree)

    # ---- serialisation -------------------------------------------------------------------------
    def to_json(self, indent: Optional[int] = 2) -> str:
        return self.model_dump_json(indent=indent, exclude_none=True)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError("(file)", text[:40], f"not valid JSON: {exc}") from None
        return cls.from_dict(data)

    def to_toml(self) -> str:
        """TOML text (top-level scalars, then `[[stages]]` with `[[stages.replicas]]` under each)."""
        out = [f"version = {self.version}", f"model = {json.dumps(self.model)}",
               f"num_microbatches = {self.num_microbatches}", f"schedule = {json.dumps(self.schedule)}",
               f"zero = {self.zero}"]
        for s in self.stages:
            out += ["", "[[stages]]", f"layers = [{s.layers[0]}, {s.layers[1]}]",
                    f"recompute = {json.dumps(s.recompute)}"]
            if s.experts is not None:
                out.append(f"experts = {json.dumps(s.experts)}")
            if s.ep is not None:
                out.append(f"ep = {s.ep}")
            for r in s.replicas:
                out += ["", "[[stages.replicas]]", f"ranks = {json.dumps(r.ranks)}", f"microbatch = {r.microbatch}"]
        return "\n".join(out) + "\n"

    @classmethod
    def from_toml(cls, text: str) -> "Plan":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PlanError("(file)", text[:40], f"not valid TOML: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> "Plan":
        if not isinstance(data, dict):
            raise PlanError("(top level)", data, "a plan is a table of fields")
        return cls(**data)

    def save(self, path: Union[str, Path]) -> Path:
        """Write to `path`: TOML for .toml, JSON for .json."""
        path = Path(path)
        text = {".toml": self.to_toml, ".json": self.to_json}.get(path.suffix)
        if text is None:
            raise PlanError("(path)", str(path), "a plan file ends in .toml or .json")
        path.write_text(text(), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: Union[str, Path]) -> "Plan":
        path = Path(path)
        read = {".toml": cls.from_toml, ".json": cls.from_json}.get(path.suffix)
        if read is None:
            raise PlanError("(path)", str(path), "a plan file ends in .toml or .json")
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise PlanError("(path)", str(path), f"cannot read: {exc}") from None
        return read(text)

    def describe(self) -> str:
        """A few lines for humans: stages, their layers, replicas (ranks x rows) and experts."""
        lines = [f"plan for {self.model!r}: {len(self.stages)} stage(s), schedule {self.schedule}, "
                 f"zero {self.zero}, {self.num_microbatches} micro-batch(es) of {self.microbatch_size} "
                 f"rows = global batch {self.global_batch}"]
        for i, s in enumerate(self.stages):
            reps = ", ".join(f"{r.ranks}x{r.microbatch}" for r in s.replicas)
            ex = f"; experts {s.experts}" if s.experts is not None else ""
            ex += f" (ep {s.ep}: {s.dp // s.ep} EP groups)" if s.ep is not None else ""
            lines.append(f"  stage {i}: layers [{s.layers[0]}, {s.layers[1]}), tp {s.tp}, dp "
                         f"{len(s.replicas)}: {reps}; recompute {s.recompute}{ex}")
        return "\n".join(lines)


# ---- Plan.check ----------------------------------------------------------------------------------
def _stage_layout(stage: Stage) -> tuple:
    return tuple(tuple(r.ranks) for r in stage.replicas)


def _check(plan: Plan, topo: Any, cfg: Any) -> None:
    world = topo.world_size
    if plan.model != cfg.name:
        raise PlanError("model", plan.model, f"the plan is for model {plan.model!r}, the config given is "
                        f"{cfg.name!r}")
    _check_ranks(plan, topo, world)
    _check_schedule(plan)
    # layers tile [0, cfg.layers) in stage order
    expect = 0
    for i, s in enumerate(plan.stages):
        start, end = s.layers
        if start != expect:
            what = "overlaps the previous stage" if start < expect else "leaves a gap after the previous stage"
            raise PlanError(f"stages[{i}].layers", list(s.layers),
                            f"starts at block {start} but the previous stages end at {expect}: it {what}; the "
                            f"stages' ranges must tile [0, {cfg.layers}) in order")
        if end > cfg.layers:
            raise PlanError(f"stages[{i}].layers", list(s.layers),
                            f"ends at block {end} but model {cfg.name!r} has {cfg.layers} layers")
        expect = end
    if expect != cfg.layers:
        raise PlanError(f"stages[{len(plan.stages) - 1}].layers", list(plan.stages[-1].layers),
                        f"the stages cover blocks [0, {expect}) but model {cfg.name!r} has {cfg.layers} "
                        f"layers: blocks [{expect}, {cfg.layers}) are on no stage")
    for i, s in enumerate(plan.stages):
        tp = s.tp
        # seq: apply_plan's TP uses sequence-parallel norms (hal/strategies/tensor_parallel.py), which
        # split the sequence over the TP group
        for what, n in (("heads", cfg.heads), ("kv_heads", cfg.kv_heads), ("ffn", cfg.ffn), ("seq", cfg.seq)):
            if n % tp:
                raise PlanError(f"stages[{i}].replicas[0].ranks", s.replicas[0].ranks,
                                f"TP degree {tp} does not divide the model's {what} = {n} ({n} % {tp} = "
                                f"{n % tp})")
        _check_experts(i, s, cfg)


def _check_ranks(plan: Plan, topo: Any, world: int) -> None:
    seen: dict[int, tuple[int, int]] = {}
    layouts = [_stage_layout(s) for s in plan.stages]
    multi = plan.schedule in MULTI_STAGE_SCHEDULES
    for i, s in enumerate(plan.stages):
        for j, r in enumerate(s.replicas):
            field = f"stages[{i}].replicas[{j}].ranks"
            bad = [x for x in r.ranks if x >= world]
            if bad:
                raise PlanError(field, r.ranks, f"rank(s) {bad} out of range: the cluster has {world} ranks "
                                f"(0..{world - 1})")
            for x in r.ranks:
                if x in seen:
                    a, b = seen[x]
                    # under an interleaved/V schedule a rank hosts several stages, with the same layout
                    if not (multi and a != i and layouts[a] == layouts[i]):
                        raise PlanError(field, r.ranks, f"rank {x} is also in stages[{a}].replicas[{b}]; "
                                        f"each rank holds one place (schedule {plan.schedule})")
                else:
                    seen[x] = (i, j)
            if r.ranks != sorted(r.ranks):
                # a TP group's process group orders ranks ascending and DTensor puts shard t on its
                # t-th rank, so the plan's TP index (position in this list) must be that order
                raise PlanError(field, r.ranks, f"TP ranks must ascend ({sorted(r.ranks)}): TP index t "
                                f"(the DP group it joins) is the rank holding TP shard t")
            chips = {x: topo.chip_of(x) for x in r.ranks}
            if len(set(chips.values())) > 1:
                raise PlanError(field, r.ranks, f"TP group spans chip kinds {chips}; a TP group must be one "
                                f"chip kind")
            subs = {x: topo.sub_cluster_of(x).name for x in r.ranks}
            if len(set(subs.values())) > 1:
                raise PlanError(field, r.ranks, f"TP group spans sub-clusters {subs}; a TP group must stay "
                                f"inside one sub-cluster's fabric")
    missing = sorted(set(range(world)) - set(seen))
    if missing:
        raise PlanError("stages", f"{len(seen)} of {world} ranks", f"rank(s) {missing} of the {world}-rank "
                        f"cluster are in no stage; every rank must have a place")


def _check_schedule(plan: Plan) -> None:
    n, m = len(plan.stages), plan.num_microbatches
    layouts = [_stage_layout(s) for s in plan.stages]
    if plan.schedule == "1F1B" and n > 1 and m < n:
        # torch.distributed.pipelining.Schedule1F1B raises the same (torch 2.13, schedules.py)
        raise PlanError("num_microbatches", m, f"schedule 1F1B needs at least as many micro-batches as "
                        f"stages: {m} < {n} stages")
    if plan.schedule not in MULTI_STAGE_SCHEDULES:
        return
    groups = list(dict.fromkeys(layouts))  # distinct rank layouts = pipeline ranks, in first-use order
    p = len(groups)
    if plan.schedule == "ZBVZeroBubble":
        # torch's ScheduleZBVZeroBubble: exactly 2 stages per rank, placed in a V (0..p-1, p-1..0)
        want = [groups[s] if s < p else groups[2 * p - 1 - s] for s in range(2 * p)]
        if n != 2 * p or layouts != want:
            raise PlanError("stages", f"{n} stages on {p} rank groups", "schedule ZBVZeroBubble needs exactly "
                            "2 stages per rank group placed in a V: stage s and stage 2p-1-s on the same "
                            f"ranks (p = {p}); got layouts {[groups.index(x) for x in layouts]}")
        return
    # Interleaved1F1B: v stages per rank group, round-robin (stage s on group s % p)
    if n % p or layouts != [groups[s % p] for s in range(n)] or n == p:
        raise PlanError("stages", f"{n} stages on {p} rank groups", "schedule Interleaved1F1B needs v >= 2 "
                        "stages per rank group placed round-robin (stage s on group s % p); got groups "
                        f"{[groups.index(x) for x in layouts]}")
    rounds = max(1, m // p)  # torch's ScheduleInterleaved1F1B rule (torch 2.13, schedules.py)
    if m % rounds:
        raise PlanError("num_microbatches", m, f"schedule Interleaved1F1B with {p} pipeline ranks needs the "
                        f"micro-batch count to be a multiple of its rounds max(1, {m} // {p}) = {rounds}")


def _check_experts(i: int, s: Stage, cfg: Any) -> None:
    if s.experts is None:
        return
    field = f"stages[{i}].experts"
    if not cfg.experts:
        raise PlanError(field, s.experts, f"model {cfg.name!r} is dense (experts = 0); expert placement "
                        f"only applies to a MoE model")
    if len(s.experts) != len(s.replicas):
        raise PlanError(field, s.experts, f"EP group size: {len(s.experts)} expert lists for {len(s.replicas)} "
                        f"replicas; the EP group is the stage's replicas, one list each")
    # every EP group (ep consecutive replicas) repeats group 0's placement (Stage checks it), so
    # checking group 0 covers them all
    counts: dict[int, int] = {}
    for j, ids in enumerate(s.experts[:s.ep_degree]):
        if not ids:
            raise PlanError(f"{field}[{j}]", ids, f"replica {j} hosts no expert; every EP rank hosts >= 1")
        bad = [e for e in ids if not 0 <= e < cfg.experts]
        if bad:
            raise PlanError(f"{field}[{j}]", ids, f"expert id(s) {bad} out of range 0..{cfg.experts - 1}")
        for e in ids:
            counts[e] = counts.get(e, 0) + 1
    twice = sorted(e for e, c in counts.items() if c > 1)
    missing = sorted(set(range(cfg.experts)) - set(counts))
    if twice or missing:
        raise PlanError(field, s.experts, f"every one of the {cfg.experts} experts must be hosted exactly once "
                        f"in each EP group (ep = {s.ep_degree}): placed more than once {twice}, nowhere {missing}")


# ---- Plan.even / Plan.weighted -------------------------------------------------------------------
def _proportional(total: int, weights: Sequence[float], what: str) -> list[int]:
    """`total` split into len(weights) integers >= 1 proportional to `weights` (largest remainder)."""
    n = len(weights)
    if total < n:
        raise PlanError(what, total, f"cannot give each of {n} parts at least 1 (only {total})")
    quota = [total * w / sum(weights) for w in weights]
    out = [max(1, int(q)) for q in quota]
    while sum(out) < total:
        k = max(range(n), key=lambda i: (quota[i] - out[i], -i))
        out[k] += 1
    while sum(out) > total:
        k = min((i for i in range(n) if out[i] > 1), key=lambda i: (quota[i] - out[i], i))
        out[k] -= 1
    return out


def _build(cls, topo: Any, cfg: Any, global_batch: int, num_microbatches: int, pp: int, tp: int, zero: int,
           schedule: str, recompute: str, ep: bool, stage_ranks: Optional[Sequence[Sequence[int]]],
           speeds: Optional[dict], weight_layers: bool, check: bool, ep_degree: Optional[int] = None) -> Plan:
    world = topo.world_size
    if num_microbatches < 1 or global_batch % num_microbatches:
        raise PlanError("global_batch", global_batch, f"must be a positive multiple of num_microbatches = "
                        f"{num_microbatches}")
    mb_size = global_batch // num_microbatches
    if stage_ranks is None:
        if pp < 1 or world % pp:
            raise PlanError("pp", pp, f"{world} ranks do not split into {pp} equal stages ({world} % {pp} = "
                            f"{world % pp if pp > 0 else 'n/a'}); pass stage_ranks for an uneven split")
        per = world // pp
        stage_ranks = [list(range(k * per, (k + 1) * per)) for k in range(pp)]
    groups = [list(g) for g in stage_ranks]
    for k, g in enumerate(groups):
        if tp < 1 or len(g) % tp:
            raise PlanError("tp", tp, f"stage rank group {k} has {len(g)} ranks {g}, not a multiple of tp = {tp}")
    virtual = 2 if schedule in MULTI_STAGE_SCHEDULES else 1
    # pipeline stage order: group k for stage s (round-robin for Interleaved1F1B, a V for ZBV)
    p = len(groups)
    order = [s % p for s in range(p * virtual)] if schedule != "ZBVZeroBubble" else \
        [s if s < p else 2 * p - 1 - s for s in range(2 * p)]

    def speed_of(ranks: list[int]) -> float:
        if speeds is None:
            return float(len(ranks))
        missing = sorted({topo.chip_of(r) for r in ranks} - set(speeds))
        if missing:
            raise PlanError("speeds", speeds, f"no speed for chip(s) {missing} (ranks {ranks})")
        return float(sum(speeds[topo.chip_of(r)] for r in ranks))

    if speeds is not None and (not speeds or any(not v > 0 for v in speeds.values())):
        raise PlanError("speeds", speeds, "every chip speed must be > 0")
    stage_speed = [speed_of(groups[k]) for k in order]
    if speeds is not None and weight_layers:
        layer_counts = _proportional(cfg.layers, stage_speed, "layers")
    else:
        layer_counts = _proportional(cfg.layers, [1.0] * len(order), "layers")
        layer_counts.sort(reverse=True)  # earlier stages one more when uneven (as split_stages does)
    stages, start = [], 0
    for s, k in enumerate(order):
        tp_groups = [groups[k][i:i + tp] for i in range(0, len(groups[k]), tp)]
        dp = len(tp_groups)
        if speeds is None:
            if mb_size % dp:
                raise PlanError("global_batch", global_batch, f"the even split gives each of {dp} replicas of "
                                f"stage {s} the same rows: micro-batch size {mb_size} (= {global_batch} / "
                                f"{num_microbatches}) is not a multiple of {dp}")
            rows = [mb_size // dp] * dp
        else:
            rows = _proportional(mb_size, [speed_of(g) for g in tp_groups], "global_batch")
        experts = None
        e_deg = dp if ep_degree is None else ep_degree
        if ep and cfg.experts:
            if e_deg < 1 or dp % e_deg:
                raise PlanError("ep_degree", ep_degree, f"EP degree {e_deg} does not divide stage {s}'s {dp} "
                                f"replicas ({dp} % {e_deg} = {dp % e_deg if e_deg > 0 else 'n/a'})")
            if speeds is None:
                if cfg.experts % e_deg:
                    raise PlanError("ep", ep, f"{cfg.experts} experts do not split evenly over {e_deg} replicas "
                                    f"(EP degree)")
                counts = [cfg.experts // e_deg] * e_deg
            else:
                counts = _proportional(cfg.experts, [speed_of(g) for g in tp_groups[:e_deg]], "experts")
            offs = [sum(counts[:j]) for j in range(e_deg)]
            experts = [list(range(o, o + c)) for o, c in zip(offs, counts)] * (dp // e_deg)
        stages.append(Stage(layers=(start, start + layer_counts[s]), recompute=recompute, experts=experts,
                            ep=ep_degree if (experts is not None and ep_degree is not None) else None,
                            replicas=[Replica(ranks=g, microbatch=m) for g, m in zip(tp_groups, rows)]))
        start += layer_counts[s]
    plan = cls(model=cfg.name, num_microbatches=num_microbatches, schedule=schedule, zero=zero, stages=stages)
    return plan.check(topo, cfg) if check else plan
