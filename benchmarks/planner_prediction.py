"""Prediction error of the planner's step simulator against measured steps on emulated clusters.

    python benchmarks/planner_prediction.py [--scale S] [--warmup 2] [--repeats 5] [--only NAME ...]
                                            [--untimed] [--json out.json]

For each layout (chip map x Plan, below) the layout is run for real: a WorkerPool of one process per
rank (torchrun's variables, HAL_EMULATE = the chip map, every chip EMULATED on this host's CPU),
`hal.strategies.apply.apply_plan` builds the run and each step is what hal/trainer/loop.py runs (`run.step`
+ AdamW). The default process group is the `hetero` bridge (`--backend gloo` for plain gloo): timed
emulation wraps the bridge's Python ProcessGroup collectives (hal.emulation.timed, commit 2e72246; before it
the clock never saw them and every rank's step came out as its own busy time, no bubble), so the
clocks synchronise at every collective and send/recv on either backend. All ranks are CPU processes either way. The measured step time is, per step, the longest rank's
time from a common barrier to the end of its optimizer step; the figure is the median over
`--repeats` steps after `--warmup`. With timed emulation on (`HAL_EMULATE_TIMED=1`, hal.emulation.timed, the
default here) an emulated chip's compute takes the time its speed says on a virtual clock, slept up
to at synchronisation points, so the steps keep the emulated chips' speed ratios whatever else the
host runs; communication is the host's real CPU fabric (not emulated).

The prediction is `hal.strategies.planner.simulate` on the same Plan with chip figures that describe the
EMULATED chips (`hal.strategies.planner.facts.emulated_chip_facts`: the timed emulation's FLOP/s and
bytes/s at this time scale, `hal.emulation.timed.chip_speeds`), not the real chips, and link figures measured
on this host by a send/recv ping-pong probe over the same backend before the layouts run
(alpha + bytes / beta, least squares). It prints each (predicted, measured) pair, the mean absolute
percentage error and Spearman's rank correlation between the predicted and the measured order.

`--untimed` runs without timed emulation (plain CPU speed): the measured figures are then this
host's, and the comparison is meaningless; it exists to check the harness.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# a small GPT: big enough that a layer is many ops, small enough that the host's real compute stays
# far below the emulated chips' virtual time (what makes timed emulation load-independent)
MODEL = dict(name="pred", layers=4, hidden=64, heads=4, ffn=128, vocab=256, seq=32)
GLOBAL_BATCH = 16
TIMEOUT_S = 120.0
DTYPE_BYTES = 4        # build_model's parameters and activations are float32 (bytes are charged as run)
CHARGE_DTYPE = "bfloat16"   # the dtype timed emulation charges FLOPs at (hal.emulation.timed.DEFAULT_DTYPE)


# ---- on every rank (WorkerPool) -------------------------------------------------------------------
_book = None


def w_init(backend: str = "gloo", timeout_s: float = TIMEOUT_S) -> dict:
    import torch
    import torch.distributed as dist

    import hal.ccl_bridge  # noqa: F401 - registers the `hetero` backend
    import hal
    global _book
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        _book = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    acc = hal.accelerator()
    return {"rank": dist.get_rank(), "chip": acc.chip.name, "emulated": bool(acc.emulated)}


def _flush() -> None:
    """Let the emulated chip finish what it was charged (timed emulation sleeps up to its clock)."""
    import hal
    hal.accelerator().synchronize()


def w_probe(sizes: list, reps: int) -> list:
    """Ping-pong between rank 0 and the last rank (different chips) over the world group: the
    one-way seconds per size (hal.strategies.planner.link_probe, the probe hal train's plan auto uses)."""
    from hal.strategies.planner.link_probe import ping_pong
    return ping_pong(sizes, reps, _book)


def w_measure(plan_json: str, model: dict, warmup: int, repeats: int) -> dict:
    """Run the plan `warmup + repeats` steps; per step this rank's seconds from a common barrier to
    the end of its optimizer step, and timed-emulation clock statistics when on."""
    import torch
    import torch.distributed as dist

    from hal.core.topology import Topology
    from hal.strategies.apply import apply_plan
    from hal.strategies.models import ModelConfig, build_model
    from hal.strategies.plan import Plan
    plan = Plan.from_json(plan_json)
    cfg = ModelConfig(**model)
    topo = Topology.from_env(world_size=dist.get_world_size())
    net = build_model(cfg, 0)
    run = apply_plan(net, plan, topo, model_cfg=cfg, timeout=timedelta(seconds=TIMEOUT_S))
    params = run.parameters()
    opt = torch.optim.AdamW(params, lr=1e-4, foreach=False) if params else None
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, cfg.vocab, (plan.global_batch, cfg.seq + 1), generator=g)
    x, y = data[:, :-1], data[:, 1:]
    try:
        from hal.emulation import timed
        clock = timed.active_clock()
    except ImportError:
        clock = None
    times, stats = [], []
    for _ in range(warmup + repeats):
        _flush()
        dist.barrier(group=_book)
        if clock is not None:
            clock.reset_stats()
        t0 = time.perf_counter()
        run.step(x, y)
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        _flush()
        times.append(time.perf_counter() - t0)
        if clock is not None:
            st = clock.stats()
            stats.append({k: st[k] for k in ("busy_s", "overrun_count", "overrun_s", "slept_s", "ops", "bytes")})
    del run, opt
    return {"times": times, "clock": stats}


# ---- layouts ----------------------------------------------------------------------------------------
def _manual(stages, m: int, zero: int = 0) -> str:
    """Plan JSON: stages = [((first, end layer), [(ranks, rows), ...]), ...]."""
    return json.dumps({"version": 1, "model": MODEL["name"], "num_microbatches": m, "schedule": "1F1B",
                       "zero": zero, "stages": [{"layers": list(layers), "recompute": "none",
                                                 "replicas": [{"ranks": list(r), "microbatch": mb} for r, mb in reps]}
                                                for layers, reps in stages]})


def layouts(speeds: dict) -> list[tuple[str, str, str]]:
    """(name, HAL_EMULATE map, Plan JSON). `speeds`: chip -> emulated FLOP/s (for Plan.weighted)."""
    from hal.core.topology import Topology
    from hal.strategies.models import ModelConfig
    from hal.strategies.plan import Plan
    cfg = ModelConfig(**MODEL)
    G = GLOBAL_BATCH
    out = []

    def topo(emap):
        chips = [c for item in emap.split(",") for c, n in [item.split(":")] for _ in range(int(n))]
        return Topology.from_chips(chips)

    def add(name, emap, plan):
        out.append((name, emap, plan if isinstance(plan, str) else plan.to_json()))

    t = topo(e := "cuda:2,ascend:2")
    add("2+2 DP4 even rows m2", e, Plan.even(t, cfg, G, 2))
    add("2+2 DP4 rows by speed m2", e, Plan.weighted(t, cfg, G, speeds, num_microbatches=2))
    add("2+2 PP2xDP2 even m4", e, Plan.even(t, cfg, G, 4, pp=2))
    add("2+2 PP2xDP2 layers by speed m4", e, Plan.weighted(t, cfg, G, speeds, num_microbatches=4, pp=2))
    add("2+2 PP2xDP2 even ZeRO-2 m4", e, Plan.even(t, cfg, G, 4, pp=2, zero=2))
    add("2+2 TP2 cuda | DP2 ascend m4", e, _manual([((0, 2), [((0, 1), 4)]), ((2, 4), [((2,), 2), ((3,), 2)])], 4))
    t = topo(e := "cuda:3,ascend:1")
    add("3+1 DP4 rows by speed m2", e, Plan.weighted(t, cfg, G, speeds, num_microbatches=2))
    add("3+1 PP2 by speed m4", e, Plan.weighted(t, cfg, G, speeds, num_microbatches=4, pp=2))
    add("3+1 PP2 by speed m8", e, Plan.weighted(t, cfg, G, speeds, num_microbatches=8, pp=2))
    t = topo(e := "cuda:2,ascend:1,kunlun:1")
    add("2+1+1 DP4 rows by speed m2", e, Plan.weighted(t, cfg, G, speeds, num_microbatches=2))
    add("2+1+1 PP2xDP2 by speed m4", e, Plan.weighted(t, cfg, G, speeds, num_microbatches=4, pp=2))
    add("2+1+1 PP4 even m4", e, Plan.even(t, cfg, G, 4, pp=4))
    return out


from hal.strategies.planner.link_probe import fit_link  # noqa: E402 - one definition


# ---- the comparison ----------------------------------------------------------------------------------
def spearman(a: list, b: list) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else 0.0


def predict(plan_json: str, emap: str, scale: float, link: tuple[float, float], timed_on: bool):
    from hal.core.topology import Topology
    from hal.strategies.models import ModelConfig
    from hal.strategies.plan import Plan
    from hal.strategies.planner.convert import from_plan
    from hal.strategies.planner.cost import ModelFacts
    from hal.strategies.planner.facts import emulated_chip_facts
    from hal.strategies.planner.simulate import simulate
    chips = [c for item in emap.split(",") for c, n in [item.split(":")] for _ in range(int(n))]
    topo = Topology.from_chips(chips)
    lat, bw = link
    if timed_on:
        facts = emulated_chip_facts(topo, scale, bw, lat, CHARGE_DTYPE)
    else:   # harness check: catalog figures of the real chips (nothing to compare with)
        from hal.strategies.planner.facts import chip_facts
        facts = [chip_facts(sc) for sc in topo.sub_clusters]
    plan = Plan.from_json(plan_json)
    cfg = ModelConfig(**MODEL)
    plan.check(topo, cfg)
    lay = from_plan(plan, facts, {r: topo.node_of(r) for r in range(topo.world_size)})
    global _PROFILE
    if _PROFILE is None:
        from hal.strategies.planner.op_profile import OpProfile
        _PROFILE = OpProfile(cfg)
    by_ops = simulate(lay, ModelFacts(cfg, dtype_bytes=DTYPE_BYTES, op_profile=_PROFILE))
    by_totals = simulate(lay, ModelFacts(cfg, dtype_bytes=DTYPE_BYTES))
    return by_ops, by_totals


_PROFILE = None


def main(argv=None) -> int:
    from hal.testing import WorkerPool
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=None, help="HAL_EMULATE_TIME_SCALE (default: hal.emulation.timed's)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--only", nargs="*", default=None, help="layout names containing any of these")
    p.add_argument("--untimed", action="store_true", help="no timed emulation (checks the harness only)")
    p.add_argument("--json", default=None)
    p.add_argument("--backend", choices=("hetero", "gloo"), default="hetero",
                   help="default process group of the ranks (hetero: the ccl_bridge path hal train uses)")
    args = p.parse_args(argv)
    timed_on = not args.untimed
    scale = args.scale
    if timed_on:
        from hal.emulation import timed
        if scale is None:
            scale = timed.DEFAULT_TIME_SCALE
    speeds = {}
    if timed_on:
        from hal.emulation import timed
        for chip in ("cuda", "ascend", "kunlun"):
            speeds[chip] = timed.chip_speeds(chip, CHARGE_DTYPE, scale)[0]
    else:
        speeds = {"cuda": 2.0, "ascend": 1.0, "kunlun": 1.0}
    todo = layouts(speeds)
    if args.only:
        todo = [x for x in todo if any(o in x[0] for o in args.only)]
    by_map: dict[str, list] = {}
    for name, emap, pj in todo:
        by_map.setdefault(emap, []).append((name, pj))
    print(f"model {MODEL} fp32, global batch {GLOBAL_BATCH}; timed emulation "
          f"{'ON, scale ' + str(scale) if timed_on else 'OFF (harness check only)'}; "
          f"every chip EMULATED on this host's CPU; links are the host's CPU fabric")
    rows, link = [], None
    t_all = time.perf_counter()
    for emap, items in by_map.items():
        world = sum(int(x.split(":")[1]) for x in emap.split(","))
        env = {"HAL_EMULATE": emap, "OMP_NUM_THREADS": "1"}
        if timed_on:
            env.update({"HAL_EMULATE_TIMED": "1", "HAL_EMULATE_TIME_SCALE": repr(scale),
                        "HAL_EMULATE_TIMED_DTYPE": CHARGE_DTYPE})  # every op at the dtype the planner prices
        with WorkerPool(world, env=env) as pool:
            info = pool.run(w_init, args.backend, timeout=180)
            assert all(i["emulated"] for i in info), info
            if link is None:   # the CPU fabric is the same for every map: probe once
                sizes = [4096, 65536, 1048576, 8388608]
                secs = pool.run(w_probe, sizes, 9, timeout=180)[0]
                link = fit_link(sizes, secs)
                print(f"link probe (send/recv ping-pong over the world group, rank 0 <-> {world - 1}): "
                      + ", ".join(f"{s // 1024} KiB {t * 1e6:.0f} us" for s, t in zip(sizes, secs))
                      + f" -> latency {link[0] * 1e6:.0f} us, bandwidth {link[1] / 1e9:.2f} GB/s")
            for name, pj in items:
                res = pool.run(w_measure, pj, MODEL, args.warmup, args.repeats, timeout=600)
                per_step = [max(r["times"][i] for r in res) for i in range(args.warmup + args.repeats)]
                meas = statistics.median(per_step[args.warmup:])
                sim, sim_totals = predict(pj, emap, scale or 1.0, link, timed_on)
                spread = (max(per_step[args.warmup:]) - min(per_step[args.warmup:])) / meas
                # overrun in the measured steps (the host behind the emulated chip), summed over ranks
                over = sum(c["overrun_s"] for r in res for c in (r["clock"] or [])[args.warmup:])
                rows.append({"layout": name, "map": emap, "predicted_s": sim.step_time_s, "measured_s": meas,
                             "predicted_totals_s": sim_totals.step_time_s, "steps_s": per_step, "spread": spread,
                             "overrun_s_all_ranks": over, "rank_times_s": [r["times"] for r in res],
                             "clock": [r.get("clock") for r in res]})
                print(f"  {name:<32} predicted {sim.step_time_s * 1e3:8.1f} ms  measured {meas * 1e3:8.1f} ms  "
                      f"error {(sim.step_time_s - meas) / meas * 100:+6.1f}%   [from totals {sim_totals.step_time_s * 1e3:8.1f}"
                      f" ms {(sim_totals.step_time_s - meas) / meas * 100:+6.1f}%]  spread {spread * 100:.1f}%  "
                      f"overrun {over * 1e3:.0f} ms", flush=True)
    meas = [r["measured_s"] for r in rows]
    out = {"rows": rows, "link": link, "scale": scale, "timed": timed_on, "model": MODEL}
    print()
    for key, label in (("predicted_s", "op-by-op cost model"), ("predicted_totals_s", "totals cost model")):
        pred = [r[key] for r in rows]
        mape = sum(abs(a - b) / b for a, b in zip(pred, meas)) / len(rows) * 100
        rho = spearman(pred, meas)
        same = sorted(range(len(rows)), key=pred.__getitem__) == sorted(range(len(rows)), key=meas.__getitem__)
        # a pair whose measured gap is inside either layout's own step-to-step spread has no measured
        # order (a tie): the ranking is checked on the other pairs, and every swapped pair is printed
        swapped, ties = [], 0
        for i in range(len(rows)):
            for j in range(i + 1, len(rows)):
                gap = abs(meas[i] - meas[j]) / min(meas[i], meas[j])
                tie = gap <= max(rows[i]["spread"], rows[j]["spread"])
                ties += tie
                if (pred[i] - pred[j]) * (meas[i] - meas[j]) < 0:
                    swapped.append((rows[i]["layout"], rows[j]["layout"], gap, tie))
        untied = [s for s in swapped if not s[3]]
        print(f"{label:<22}: {len(rows)} layouts, MAPE {mape:.2f}%, Spearman rank correlation {rho:.3f} "
              f"(predicted order {'==' if same else '!='} measured order); {len(swapped)} of "
              f"{len(rows) * (len(rows) - 1) // 2} pairs swapped, {len(untied)} of them measured further apart "
              f"than their step spread ({ties} pairs tie within it)")
        if key == "predicted_s":
            for a, b, gap, tie in swapped:
                print(f"    swapped: {a} / {b}: measured {gap * 100:.2f}% apart"
                      f"{' (within the step spread: a tie)' if tie else ''}")
        out[key.replace("_s", "")] = {"mape_pct": mape, "spearman": rho, "same_order": same,
                                      "swapped_pairs": [list(s) for s in swapped], "swapped_outside_spread": len(untied),
                                      "tied_pairs": ties}
    print(f"{time.perf_counter() - t_all:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
