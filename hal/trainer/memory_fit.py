"""Does the Plan fit each chip's memory? The planner's own memory model (hal.strategies.planner: the
per-rank peak bytes of `cost._memory_bytes`, through `simulate`, the function `plan.source = auto`'s
search ranks its candidates with) applied to whatever Plan a run uses - even, a file or auto - before
torchrun starts (hal/cli/train.py calls hal.trainer.trainer.make_plan) and again on the ranks.

A plan that does not fit is a `PlanMemoryError` listing each rank over its chip's memory: rank, chip and
model, bytes needed and usable bytes in GiB (the capacity the planner uses, hal.strategies.planner.facts:
the cluster spec's `memory` of the sub-cluster, else the catalog profile's memory or its stated default,
less the planner's headroom). Emulated chips are held
to the memory of the chip they emulate (their tensors live in this host's RAM, which is not checked here);
activations are priced at the bytes of the run's `[train] precision` (4 for fp32, 2 for bf16/fp16; master
weights, gradients and AdamW state are the planner's mixed-precision 16 bytes per parameter either way).
"""
from __future__ import annotations

from typing import Any

from hal.contract.errors import HalError

GIB = float(1 << 30)


class PlanMemoryError(HalError, ValueError):
    """A plan whose ranks need more memory than their chips have (the figures per rank)."""


def memory_per_rank(plan: Any, topo: Any, model_cfg: Any, precision: str = "fp32") -> tuple[list, dict]:
    """(the planner's RankStats of `plan` on `topo`: memory_bytes and capacity_bytes per rank, the
    ChipFacts of each sub-cluster by name). `precision` ([train] precision): activations at its bytes,
    each chip's facts at the 16-bit dtype it has (hal.strategies.precision; a 910A has no bfloat16)."""
    from hal.strategies.precision import activation_bytes, facts_dtype
    from hal.strategies.planner.convert import from_plan
    from hal.strategies.planner.cost import ModelFacts
    from hal.strategies.planner.facts import cluster_facts, load_matrices
    from hal.strategies.planner.simulate import simulate
    # the cluster spec's `memory` per sub-cluster where it states one (cluster_facts), else the catalog's
    facts = cluster_facts(topo, load_matrices(None), dtype=lambda sc: facts_dtype(sc.chip, sc.model))
    node_of = {r: topo.node_of(r) for r in range(topo.world_size)}
    sim = simulate(from_plan(plan, facts, node_of), ModelFacts(model_cfg, dtype_bytes=activation_bytes(precision)))
    return sim.ranks, {f.name: f for f in facts}


def check_fits(plan: Any, topo: Any, model_cfg: Any, source: str, precision: str = "fp32") -> None:
    """PlanMemoryError naming every rank whose share of `plan` exceeds its chip's memory."""
    ranks, facts = memory_per_rank(plan, topo, model_cfg, precision)
    over = [r for r in ranks if r.memory_bytes > r.capacity_bytes]
    if not over:
        return
    emulated = {sc.name for sc in topo.sub_clusters if sc.emulated}
    shown = "; ".join(f"rank {r.rank} ({r.chip} {facts[r.sub_cluster].model}"
                      f"{', emulated' if r.sub_cluster in emulated else ''}): needs {r.memory_bytes / GIB:,.1f} GiB, "
                      f"usable {r.capacity_bytes / GIB:,.1f} GiB" for r in over[:4])
    more = f"; and {len(over) - 4} more ranks" if len(over) > 4 else ""
    raise PlanMemoryError(f"plan {source} for model {model_cfg.name!r} does not fit memory (the planner's memory "
                          f"model: parameters, AdamW state, activations): {shown}{more}; use more chips, a "
                          f"sharded plan (plan.zero = 3, pp, tp), a smaller global_batch or seq, or plan.source = "
                          f"'auto'")
