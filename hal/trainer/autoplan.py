"""`plan.source = auto`: the planner's layout for the cluster the run has.

On real chips (or emulated chips without timed emulation) the planner prices each sub-cluster with its
catalog / efficiency-matrix figures (`hal.strategies.planner.facts.chip_facts`). Under timed emulation
(HAL_EMULATE_TIMED=1) the chips that run are the EMULATED ones: compute and memory at the speeds the
virtual clock charges (`facts.emulated_chip_facts`, hal.emulation.timed.chip_speeds at this time scale) and every
link the host's CPU fabric, whose latency and bandwidth are measured at start by a send/recv ping-pong
between rank 0 and the last rank over the training backend (alpha + bytes/beta, least squares, as
benchmarks/planner_prediction.py does). Without that the planner would lay the model out for real H100
NVLink figures while the run's links are this host's shared memory. Each sub-cluster is priced at the
dtype its clock will charge (`charged_dtypes`: the dtype its ranks compute in under [train] precision,
re-mapped or forced by HAL_EMULATE_TIMED_DTYPE as the clock does), and the plan carries the schedule
the search picked (1F1B, or Interleaved1F1B / ZBVZeroBubble for a multi-stage layout).
"""
from __future__ import annotations

from typing import Mapping, Optional

import torch.distributed as dist

PROBE_SIZES = (4 << 10, 64 << 10, 512 << 10)
PROBE_REPS = 5


def timed_on() -> bool:
    try:
        from hal.emulation import timed
    except ImportError:
        return False
    return timed.timed_requested()


def probe_link(book) -> Optional[tuple[float, float]]:
    """(latency s, bandwidth B/s) of the training backend between rank 0 and the last rank, on every
    rank (a collective over the world; `book` is the bookkeeping group for the barriers). None for a
    single rank."""
    from hal.strategies.planner.link_probe import fit_link, ping_pong
    if dist.get_world_size() == 1:
        return None
    box = [ping_pong(PROBE_SIZES, PROBE_REPS, book)]
    dist.broadcast_object_list(box, src=0, group=book)
    return fit_link(list(PROBE_SIZES), box[0])


def charged_dtypes(precision: str, topo, env: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """Sub-cluster name -> the dtype timed emulation charges its FLOPs at: the dtype its ranks compute
    in (hal.strategies.precision.resolve_dtype of [train] precision on the chip's catalog profile: per
    chip kind under "auto"), unless HAL_EMULATE_TIMED_DTYPE forces one on that chip (`DTYPE`, optionally
    `CHIP:` scoped) or re-maps it (`FROM=TO`): hal.emulation.timed_cost.charge_plan, as the clock reads it."""
    from hal import envs
    from hal.core import catalog
    from hal.emulation.timed_cost import charge_plan
    from hal.strategies.precision import resolve_dtype
    text = envs.HAL_EMULATE_TIMED_DTYPE.text(env)
    out = {}
    for sc in topo.sub_clusters:
        prof = catalog.profile_for(sc.chip, sc.model)
        forced, mapping = charge_plan(text, sc.chip, str(prof.model))
        runs = resolve_dtype(precision, prof, sc.ranks[0], sc.chip)
        out[sc.name] = forced or mapping.get(runs, runs)
    return out


def auto_plan(cfg, topo, model_cfg, link: Optional[tuple[float, float]]):
    """The planner's best layout (cost model + simulator); `link` given = timed emulation's figures."""
    from hal.strategies.planner.convert import to_plan
    from hal.strategies.planner.cost import ModelFacts
    from hal.strategies.planner.facts import cluster_facts, emulated_chip_facts, load_matrices
    from hal.strategies.planner.plan_search import search
    node_of = {r: topo.node_of(r) for r in range(topo.world_size)}
    if timed_on():
        from hal.emulation import timed
        lat, bw = link if link is not None else (0.0, 1e12)
        dtypes = charged_dtypes(cfg.train.precision, topo)
        facts = emulated_chip_facts(topo, timed.time_scale(), bw, lat, lambda sc: dtypes[sc.name])
        from hal.strategies.precision import activation_bytes
        dtype_bytes = activation_bytes(cfg.train.precision)  # bytes are charged as run: fp32 4, bf16/fp16 2
        result = search(facts, ModelFacts(model_cfg, dtype_bytes=dtype_bytes), cfg.global_batch, node_of=node_of,
                        max_pp=cfg.plan.max_pp)
    else:
        facts = cluster_facts(topo, load_matrices(None))     # the spec's per-sub-cluster memory, as hal plan
        result = search(facts, ModelFacts(model_cfg), cfg.global_batch, node_of=node_of, max_pp=cfg.plan.max_pp)
    # the schedule the search picked: 1F1B for one stage per rank group, else Interleaved1F1B / ZBVZeroBubble
    return to_plan(result.best.layout, model_cfg.name, result.best.layout.schedule)
