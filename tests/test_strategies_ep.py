"""Expert parallel (hal.strategies.moe, hal.strategies.expert_parallel) matches a single-process run.

One 6-rank WorkerPool (module-scoped, emulated): cuda:3 (ranks 0-2), kunlun:2 (3-4), ascend:1 (5).
Its `hetero` subgroups are the required mixed layouts: 2+2 [0, 1, 3, 4], 3+1 [0, 1, 2, 5],
2+1+1 [0, 1, 3, 5], plus the whole 3+2+1 world. In each, the tiny MoE LM (tests/_strategy_ep_cases.py)
trains 3 SGD steps with EP over the subgroup (uneven expert placement: the cuda ranks host more experts,
one rank may host none; uneven rows per rank, one rank may feed none) and DDP over the same group for
the non-expert parameters (experts ignored by DDP), with capacity dropping ON: capacity is computed on
the global micro-batch in global token order, so the distributed run drops exactly the tokens the
single-process run drops, and the test checks the drop counts match and are > 0.

Tolerance: every fp32 parameter within 1e-5 absolute of the single-process run. The difference is
rounding only: the distributed run sums gradient contributions in another order (across the bridge,
index_add per source rank, TP partial sums), while the routing decisions are discrete and identical,
which the equal drop counts show; measured at most 3.4e-7 (the TP case), 1.5e-7 without TP. Every
compared parameter moved by at least 10 x the tolerance (least 6.3e-4), so skipped, doubled or
unreduced gradients cannot pass.
"""
import pytest


from . import _strategy_ep_cases as cases

EMULATE = "cuda:3,kunlun:2,ascend:1"
CHIPS = ["cuda", "cuda", "cuda", "kunlun", "kunlun", "ascend"]
TOL = 1e-5
pytestmark = pytest.mark.slow

# shape -> (ranks, expert placement per EP rank, rows per EP rank): faster chips host more experts
CASES = {
    "2+2": ((0, 1, 3, 4), [[0, 1, 2], [3, 4, 5], [6], [7]], [3, 3, 1, 1]),
    "3+1": ((0, 1, 2, 5), [[7, 0], [1, 2, 3], [4, 5], [6]], [2, 2, 3, 1]),
    "2+1+1": ((0, 1, 3, 5), [[0, 1, 2, 3], [4, 5, 6], [7], []], [4, 2, 2, 0]),
    "3+2+1": ((0, 1, 2, 3, 4, 5), [[0, 1], [2, 3], [4], [5], [6], [7]], [2, 2, 1, 1, 1, 1]),
}


@pytest.fixture(scope="module")
def pool(shared_pools):
    p = shared_pools.get(6, {"HAL_EMULATE": EMULATE})  # the other test_strategies_* modules' ranks
    info = p.run(cases.init, timeout=300)  # a bound, not a timing: start-up on a loaded host
    assert [i["chip"] for i in info] == CHIPS and all(i["emulated"] for i in info), info
    return p


def _check(r: dict) -> None:
    worst = {n: d for n, d in r["param_diffs"].items() if d > TOL}
    assert not worst, f"EP rank {r['ep_rank']}: parameters off the single-process run by more than {TOL}: {worst}"
    print(f"  max |param - single process| = {max(r['param_diffs'].values()):.2e}, "
          f"least moved {min(r['moved'].values()):.2e}")
    still = {n: m for n, m in r["moved"].items() if m < 10 * TOL}
    assert not still, f"EP rank {r['ep_rank']}: parameters that barely trained: {still}"
    assert r["losses"] == pytest.approx(r["ref_losses"], abs=1e-5)
    if "ref_drops" in r:
        assert r["drops"] == r["ref_drops"]


@pytest.mark.parametrize("shape", list(CASES))
def test_ep_matches_single_process(pool, shape):
    ranks, placement, rows = CASES[shape]
    results = pool.run(cases.train_ep, ranks, placement, rows, 1.0, timeout=400)
    members = [r for r in results if r["member"]]
    assert [r["ep_rank"] for r in members] == list(range(len(ranks)))
    for r, ids in zip(members, placement):
        _check(r)
        assert r["hosted"] == sorted(ids)  # each rank holds exactly its experts ...
        assert r["ddp_ignored"] == r["expert_names"] and all("experts." in n for n in r["ddp_ignored"])
    every = sorted(n for r in members for n in r["names"] if "experts." in n)
    full = sorted(n for n, _ in cases.build(1.0).named_parameters() if "experts." in n)
    assert every == full  # ... and together they hold every expert exactly once
    assert sum(sum(d) for d in members[0]["drops"]) > 0, "capacity never dropped: the case has no teeth"
    # tokens crossed ranks: a rank sends what it routes to other hosts and receives for its experts
    assert all(sum(t[0][1] for t in r["traffic"]) > 0 for r, ids in zip(members, placement) if ids)


def test_ep_without_dropping_matches(pool):
    ranks, placement, rows = CASES["3+1"]
    results = pool.run(cases.train_ep, ranks, placement, rows, 0, timeout=400)
    for r in (r for r in results if r["member"]):
        _check(r)
        assert all(d == [0] * cases.LAYERS for d in r["drops"])


@pytest.mark.parametrize("sp", [True, False])
def test_ep_inside_dp_with_tp(pool, sp):
    # 2+2 as a plan lays it out: replica 0 = TP group [0, 1] (cuda), replica 1 = TP group [3, 4]
    # (kunlun); EP group (= DP group) of tp index 0 is [0, 3], of tp index 1 is [1, 4]. The cuda
    # replica takes 3 of 4 rows and hosts 3 of 4 experts; ranks 2 and 5 sit out.
    replicas, placement, rows = [[0, 1], [3, 4]], [[0, 1, 2], [3]], [3, 1]
    results = pool.run(cases.train_ep_dp_tp, replicas, placement, rows, sp, timeout=400)
    assert [r["member"] for r in results] == [True, True, False, True, True, False]
    members = [r for r in results if r["member"]]
    assert [(r["replica"], r["tp_index"], r["ep_rank"]) for r in members] == [(0, 0, 0), (0, 1, 0), (1, 0, 1), (1, 1, 1)]
    for r in members:
        _check(r)
        assert r["hosted"] == placement[r["ep_rank"]] and r["sharded"] > 0
    assert sum(sum(d) for d in members[0]["drops"]) > 0, "capacity never dropped: the case has no teeth"


# ---- one process: the layer's semantics, spelled out by brute force (no pool needed) ----------------
def _brute_force(moe, x):
    """Token-by-token MoE with GShard's capacity order: slot 0 of every token, then slot 1, ..."""
    import math

    import torch
    xt = x.reshape(-1, moe.hidden)
    probs = torch.softmax(xt @ moe.router.weight.T, -1)
    top_p, top_e = probs.topk(moe.top_k, -1)
    gates = top_p / top_p.sum(-1, keepdim=True) if moe.top_k > 1 else top_p
    T = xt.size(0)
    cap = math.ceil(moe.capacity_factor * T * moe.top_k / moe.num_experts) if moe.capacity_factor else T * moe.top_k
    out, used, dropped = torch.zeros_like(xt), [0] * moe.num_experts, 0
    for j in range(moe.top_k):
        for t in range(T):
            e = int(top_e[t, j])
            if used[e] < cap:
                used[e] += 1
                out[t] += gates[t, j] * moe.experts[str(e)](xt[t:t + 1])[0]
            else:
                dropped += 1
    f = torch.bincount(top_e.reshape(-1), minlength=moe.num_experts).float() / (T * moe.top_k)
    aux = moe.num_experts * (f * probs.mean(0)).sum()
    return out.reshape(x.shape), dropped, aux


@pytest.mark.parametrize("top_k,cf", [(1, 1.0), (2, 1.0), (2, 1.5), (2, 0)])
def test_moe_layer_semantics(top_k, cf):
    import torch

    from hal.strategies.moe import MoE
    torch.manual_seed(0)
    moe = MoE(8, 12, 4, top_k=top_k, capacity_factor=cf)
    x = torch.randn(3, 10, 8)
    y = moe(x)
    want, dropped, aux = _brute_force(moe, x)
    assert (y - want).abs().max().item() < 1e-5
    assert moe.last_stats["dropped_global"] == dropped and (dropped > 0) == (cf == 1.0)
    assert moe.aux_loss.item() == pytest.approx(aux.item(), rel=1e-5)
    (y.sum() + moe.aux_loss).backward()
    assert all(p.grad is not None for p in moe.parameters())


def test_placement_is_validated():
    import torch

    from hal.strategies.expert_parallel import apply_ep, weighted_placement
    from hal.strategies.moe import MoE, MoEError, check_placement
    assert weighted_placement(8, [2, 2, 1, 1]) == [[0, 1, 2], [3, 4, 5], [6], [7]]
    with pytest.raises(MoEError, match="3 entries for an EP group of 4"):
        check_placement([[0], [1], [2, 3]], 4, 4)
    with pytest.raises(MoEError, match="expert 1 is placed on EP ranks 0 and 1"):
        check_placement([[0, 1], [1, 2, 3]], 4, 2)
    with pytest.raises(MoEError, match=r"experts \[3\] of 4 are hosted by no EP rank"):
        check_placement([[0, 1], [2]], 4, 2)
    with pytest.raises(MoEError, match="EP rank 1 hosts expert 9, outside 0..3"):
        check_placement([[0, 1], [2, 3, 9]], 4, 2)
    with pytest.raises(MoEError, match="has no hal.strategies.moe.MoE layer"):
        apply_ep(torch.nn.Linear(2, 2), None)
    with pytest.raises(MoEError, match=r"experts \[2, 3\] are missing"):
        MoE(8, 12, 4, local_experts=[0, 1]).set_group(None, [[0, 1, 2, 3]])
    with pytest.raises(MoEError, match="top_k=5 exceeds experts=4"):
        MoE(8, 12, 4, top_k=5)


def test_injected_aux_loss_gives_the_same_gradients():
    import torch

    from hal.strategies.expert_parallel import aux_loss, inject_aux_loss
    grads = []
    for inject in (False, True):
        model = cases.build(1.0)
        inject_aux_loss(model, cases.AUX_COEF if inject else None)
        rows = cases.batches(4)[0]
        logits = model(rows[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cases.VOCAB), rows[:, 1:].reshape(-1))
        (loss if inject else loss + cases.AUX_COEF * aux_loss(model)).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    router = [n for n in grads[0] if "router" in n]
    assert router and all(torch.allclose(grads[0][n], grads[1][n], atol=1e-7) for n in grads[0])


def test_ep_with_fsdp2_matches_single_process(pool):
    # 2+1+1 with FSDP2 (fully_shard, ZeRO-3) for the non-expert parameters, experts ignored by it
    ranks, placement, rows = CASES["2+1+1"]
    results = pool.run(cases.train_ep, ranks, placement, rows, 1.0, "fsdp2", timeout=400)
    members = [r for r in results if r["member"]]
    for r, ids in zip(members, placement):
        _check(r)
        assert r["hosted"] == sorted(ids)
