"""hal.strategies.plan: Plan round-trips (TOML, JSON, files), the even and speed-weighted constructors, and
every rejection - at construction (field-level) and in Plan.check against a topology and a model -
naming the field path and the value. Single process, no torch.distributed."""
import json

import pytest

from hal.core.cluster import ClusterSpec
from hal.core.topology import Topology
from hal.strategies.models import ModelConfig
from hal.strategies.plan import PLAN_VERSION, Plan, PlanError, Replica, Role, Stage

TINY = ModelConfig(name="tiny", layers=4, hidden=32, heads=4, ffn=64, vocab=64, seq=16)
MOE = ModelConfig(name="moe", layers=2, hidden=32, heads=4, ffn=32, vocab=64, seq=16, experts=8, top_k=2)
T22 = Topology.from_chips(["cuda", "cuda", "ascend", "ascend"])
T31 = Topology.from_chips(["cuda", "cuda", "cuda", "ascend"])
T211 = Topology.from_chips(["cuda", "cuda", "kunlun", "ascend"])


def plan(stages, **kw):
    return Plan(**{"model": "tiny", **kw, "stages": stages})


def rep(ranks, mb=1):
    return {"ranks": ranks, "microbatch": mb}


def stage(layers, *replicas, **kw):
    return {"layers": layers, "replicas": list(replicas), **kw}


def raises(fn, field, value, *words):
    with pytest.raises(PlanError) as info:
        fn()
    err = info.value
    assert err.field == field, (err.field, str(err))
    assert err.value == value, (err.value, str(err))
    assert f"{field} = {value!r}" in str(err), str(err)
    for w in words:
        assert w in str(err), (w, str(err))
    return err


# ---- round trips -------------------------------------------------------------------------------
def _rich_plan():
    return Plan(model="moe", num_microbatches=4, schedule="GPipe", zero=3, stages=[
        Stage(layers=(0, 1), recompute="full", experts=[[0, 1, 2, 3, 4], [5, 6, 7]],
              replicas=[Replica(ranks=[0, 1], microbatch=3), Replica(ranks=[2, 3], microbatch=1)]),
        Stage(layers=(1, 2), replicas=[Replica(ranks=[4], microbatch=4)])])


def test_toml_and_json_round_trip(tmp_path):
    p = _rich_plan()
    assert Plan.from_toml(p.to_toml()) == p
    assert Plan.from_json(p.to_json()) == p
    assert json.loads(p.to_json())["version"] == PLAN_VERSION
    for suffix in (".toml", ".json"):
        assert Plan.load(p.save(tmp_path / f"plan{suffix}")) == p
    assert p.check(Topology.from_chips(["cuda"] * 4 + ["ascend"]), MOE.model_copy(update={"name": "moe"})) is p


def test_schedule_is_the_shared_enum_and_reads_as_its_name():
    from hal.strategies.schedule import Schedule
    p = _rich_plan()
    assert p.schedule is Schedule.GPIPE and p.schedule == "GPipe"
    assert 'schedule = "GPipe"' in p.to_toml() and json.loads(p.to_json())["schedule"] == "GPipe"
    assert Plan.from_toml(p.to_toml()).schedule is Schedule.GPIPE
    assert plan([stage([0, 4], rep([0]))]).schedule is Schedule.ONE_F_ONE_B


def test_derived_quantities():
    p = _rich_plan()
    assert (p.microbatch_size, p.global_batch, p.ranks) == (4, 16, [0, 1, 2, 3, 4])
    assert p.rows(0, 0) == (0, 3) and p.rows(0, 1) == (3, 4) and p.rows(1, 0) == (0, 4)
    assert p.role(3) == Role(stage=0, replica=1, tp_index=1) and p.role(4) == Role(1, 0, 0)
    assert p.tp_ranks(0, 1) == [2, 3] and p.dp_ranks(0, 0) == [0, 2] and p.dp_ranks(0, 1) == [1, 3]
    assert (p.stages[0].tp, p.stages[0].dp, p.stages[1].tp, p.stages[1].dp) == (2, 2, 1, 1)
    raises(lambda: p.role(9), "stages", "rank 9", "holds 0 roles")


# ---- constructors ---------------------------------------------------------------------------------
def test_even_is_the_naive_layout():
    p = Plan.even(T31, TINY, global_batch=8, num_microbatches=2)
    assert [r.ranks for r in p.stages[0].replicas] == [[0], [1], [2], [3]]
    assert [r.microbatch for r in p.stages[0].replicas] == [1, 1, 1, 1] and p.global_batch == 8
    p = Plan.even(Topology.from_chips(["cuda"] * 6), TINY.model_copy(update={"layers": 5}), 12, pp=3, tp=2,
                  num_microbatches=3)
    assert [s.layers for s in p.stages] == [(0, 2), (2, 4), (4, 5)]  # earlier stages one more
    assert [[r.ranks for r in s.replicas] for s in p.stages] == [[[0, 1]], [[2, 3]], [[4, 5]]]
    p = Plan.even(T22, MOE.model_copy(update={"name": "tiny"}), 4, ep=True)
    assert p.stages[0].experts == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_weighted_splits_rows_layers_and_experts_by_speed():
    p = Plan.weighted(T31, TINY, global_batch=14, speeds={"cuda": 2.0, "ascend": 1.0}, num_microbatches=2)
    assert [r.microbatch for r in p.stages[0].replicas] == [2, 2, 2, 1] and p.global_batch == 14
    p = Plan.weighted(T31, TINY, 8, speeds={"cuda": 3.0, "ascend": 1.0}, pp=2, num_microbatches=2)
    assert [s.layers for s in p.stages] == [(0, 2), (2, 4)]  # speeds 6 vs 4: 2.4 -> 2, 1.6 -> 2
    assert [r.microbatch for r in p.stages[1].replicas] == [3, 1]
    p = Plan.weighted(T31, MOE.model_copy(update={"name": "tiny"}), 7, {"cuda": 2.0, "ascend": 1.0}, ep=True)
    # quotas 8 * 2/7 = 2.29 (x3) and 1.14: floors 2, 2, 2, 1, the one left to the largest remainder (first)
    assert p.stages[0].experts == [[0, 1, 2], [3, 4], [5, 6], [7]]
    raises(lambda: Plan.weighted(T31, TINY, 8, {"cuda": 1.0}), "speeds", {"cuda": 1.0}, "['ascend']")
    raises(lambda: Plan.weighted(T31, TINY, 8, {"cuda": 1.0, "ascend": 0.0}), "speeds",
           {"cuda": 1.0, "ascend": 0.0}, "> 0")
    raises(lambda: Plan.weighted(T31, TINY, 3, {"cuda": 1.0, "ascend": 1.0}), "global_batch", 3, "4 parts")


def test_constructor_rejections():
    raises(lambda: Plan.even(T31, TINY, 6), "global_batch", 6, "not a multiple of 4")
    raises(lambda: Plan.even(T31, TINY, 8, num_microbatches=3), "global_batch", 8, "num_microbatches = 3")
    raises(lambda: Plan.even(T31, TINY, 8, pp=3), "pp", 3, "4 % 3 = 1")
    raises(lambda: Plan.even(T31, TINY, 8, tp=3), "tp", 3, "not a multiple of tp = 3")
    raises(lambda: Plan.even(T22, MOE.model_copy(update={"name": "tiny", "experts": 6}), 4, ep=True),
           "ep", True, "6 experts do not split evenly over 4")


# ---- field-level rejections (construction, TOML, JSON) ----------------------------------------------
def test_field_rejections():
    ok = [stage([0, 4], rep([0]))]
    raises(lambda: plan(ok, version=2), "version", 2, "version 2 is not supported", "version 1")
    raises(lambda: plan(ok, num_microbatches=0), "num_microbatches", 0, "greater than or equal to 1")
    raises(lambda: plan(ok, zero=1), "zero", 1, "0, 2 or 3")
    raises(lambda: plan(ok, schedule="PipeDream"), "schedule", "PipeDream", "1F1B")
    raises(lambda: plan([]), "stages", [], "at least 1")
    raises(lambda: plan([stage([0, 4], rep([0], 0))]), "stages[0].replicas[0].microbatch", 0, "greater than or equal to 1")
    raises(lambda: plan([stage([0, 4], rep([]))]), "stages[0].replicas[0].ranks", [], "at least 1")
    raises(lambda: plan([stage([0, 4], rep([1, 1]))]), "stages[0].replicas[0].ranks", [1, 1], "[1] listed twice")
    raises(lambda: plan([stage([0, 4], rep([-1]))]), "stages[0].replicas[0].ranks", [-1], ">= 0")
    raises(lambda: plan([stage([0, 4], rep([0]), recompute="some")]), "stages[0].recompute", "some", "'full'")
    raises(lambda: plan([stage([2, 2], rep([0]))]), "stages[0].layers", [2, 2], "a stage with no layers")
    raises(lambda: plan([stage([-1, 2], rep([0]))]), "stages[0].layers", [-1, 2], "start must be >= 0")
    raises(lambda: plan([stage([0, 4], rep([0]), extra=1)]), "stages[0].extra", 1, "unknown field")
    raises(lambda: plan([stage([0, 4], rep([0]))], typo=1), "typo", 1, "unknown field")
    raises(lambda: Plan(stages=[stage([0, 4], rep([0]))]), "model", None, "required field is missing")


def test_shape_rejections_name_the_numbers():
    raises(lambda: plan([stage([0, 2], rep([0], 2)), stage([2, 4], rep([1], 1), rep([2], 2))]),
           "stages[1].replicas", [1, 2], "stage 1's micro-batch size 3", "stage 0's 2")
    raises(lambda: plan([stage([0, 4], rep([0, 1]), rep([2]))]), "stages[0].replicas", [[0, 1], [2]],
           "TP degrees [2, 1]")


def test_file_rejections(tmp_path):
    text = _rich_plan().to_toml().replace("microbatch = 3", "microbatch = -3")
    raises(lambda: Plan.from_toml(text), "stages[0].replicas[0].microbatch", -3, "greater than or equal to 1")
    raises(lambda: Plan.from_toml("version = "), "(file)", "version = ", "not valid TOML")
    raises(lambda: Plan.from_json("[1, 2]"), "(top level)", [1, 2], "a table of fields")
    raises(lambda: Plan.from_json("{"), "(file)", "{", "not valid JSON")
    raises(lambda: _rich_plan().save(tmp_path / "p.yaml"), "(path)", str(tmp_path / "p.yaml"), ".toml or .json")
    raises(lambda: Plan.load(tmp_path / "none.toml"), "(path)", str(tmp_path / "none.toml"), "cannot read")


# ---- Plan.check against a topology and a model ------------------------------------------------------
def check(stages, topo=T22, cfg=TINY, **kw):
    kw.setdefault("num_microbatches", 4)  # >= the stage count: what 1F1B needs
    return lambda: plan(stages, **kw).check(topo, cfg)


DP4 = [rep([0]), rep([1]), rep([2]), rep([3])]


def test_check_accepts_uneven_mixed_layouts():
    plan([stage([0, 3], rep([0, 1], 3)), stage([3, 4], rep([2], 2), rep([3], 1))],
         num_microbatches=2).check(T22, TINY)
    plan([stage([0, 4], rep([0], 3), rep([1], 3), rep([2], 1), rep([3], 1))]).check(T211, TINY)


def test_check_model_name():
    raises(check([stage([0, 4], *DP4)], cfg=MOE), "model", "tiny", "config given is 'moe'")


def test_check_ranks():
    raises(check([stage([0, 4], rep([0]), rep([1]), rep([2]), rep([4]))]), "stages[0].replicas[3].ranks", [4],
           "[4] out of range", "4 ranks (0..3)")
    raises(check([stage([0, 2], rep([0]), rep([1])), stage([2, 4], rep([1]), rep([2]))]),
           "stages[1].replicas[0].ranks", [1], "rank 1 is also in stages[0].replicas[1]")
    raises(check([stage([0, 4], rep([0]), rep([1]), rep([3]))], topo=T22), "stages", "3 of 4 ranks",
           "rank(s) [2]", "in no stage")


def test_check_tp_group_one_chip_kind_and_sub_cluster():
    raises(check([stage([0, 4], rep([0, 1]), rep([2, 3]))], topo=T31), "stages[0].replicas[1].ranks", [2, 3],
           "spans chip kinds {2: 'cuda', 3: 'ascend'}")
    two_cuda = Topology.from_spec(ClusterSpec(sub_clusters=[  # two cuda sub-clusters (two fabrics)
        dict(name="a", chip="cuda", nodes=1, ranks_per_node=1), dict(name="b", chip="ascend", nodes=1, ranks_per_node=2),
        dict(name="c", chip="cuda", nodes=1, ranks_per_node=1)]))
    assert [s.chip for s in two_cuda.sub_clusters] == ["cuda", "ascend", "cuda"]
    raises(check([stage([0, 4], rep([0, 3]), rep([1, 2]))], topo=two_cuda), "stages[0].replicas[0].ranks", [0, 3],
           "spans sub-clusters")


def test_check_layers_tile_the_model():
    raises(check([stage([0, 2], rep([0]), rep([1])), stage([3, 4], rep([2]), rep([3]))]), "stages[1].layers",
           [3, 4], "starts at block 3", "end at 2", "gap")
    raises(check([stage([0, 3], rep([0]), rep([1])), stage([2, 4], rep([2]), rep([3]))]), "stages[1].layers",
           [2, 4], "overlaps")
    raises(check([stage([1, 4], *DP4)]), "stages[0].layers", [1, 4], "starts at block 1")
    raises(check([stage([0, 5], *DP4)]), "stages[0].layers", [0, 5], "has 4 layers")
    raises(check([stage([0, 3], *DP4)]), "stages[0].layers", [0, 3], "blocks [3, 4) are on no stage")


def test_check_tp_ranks_ascend():
    raises(check([stage([0, 4], rep([1, 0]), rep([2, 3]))]), "stages[0].replicas[0].ranks", [1, 0],
           "TP ranks must ascend ([0, 1])")


def test_check_tp_divides_heads_and_ffn():
    topo = Topology.from_chips(["cuda"] * 3)
    raises(check([stage([0, 4], rep([0, 1, 2]))], topo=topo), "stages[0].replicas[0].ranks", [0, 1, 2],
           "TP degree 3 does not divide the model's heads = 4", "4 % 3 = 1")
    cfg = TINY.model_copy(update={"ffn": 66})
    raises(check([stage([0, 4], rep([0, 1, 2, 3]))], topo=Topology.from_chips(["cuda"] * 4), cfg=cfg),
           "stages[0].replicas[0].ranks", [0, 1, 2, 3], "ffn = 66", "66 % 4 = 2")
    cfg = TINY.model_copy(update={"seq": 18})
    raises(check([stage([0, 4], rep([0, 1, 2, 3]))], topo=Topology.from_chips(["cuda"] * 4), cfg=cfg),
           "stages[0].replicas[0].ranks", [0, 1, 2, 3], "seq = 18", "18 % 4 = 2")


def moe_check(experts, topo=T22):
    return check([stage([0, 2], *DP4, experts=experts)], topo=topo, cfg=MOE, model="moe")


def test_check_experts():
    moe_check([[0, 1], [2, 3], [4, 5], [6, 7]])()  # accepted
    moe_check([[0, 1, 2, 3, 4], [5], [6], [7]])()  # uneven placement is fine
    raises(check([stage([0, 4], *DP4, experts=[[0], [1], [2], [3]])]), "stages[0].experts",
           [[0], [1], [2], [3]], "is dense")
    raises(moe_check([[0, 1, 2, 3], [4, 5, 6, 7]]), "stages[0].experts", [[0, 1, 2, 3], [4, 5, 6, 7]],
           "EP group size: 2 expert lists for 4 replicas")
    raises(moe_check([[0, 1], [2, 3], [4, 5, 6, 7], []]), "stages[0].experts[3]", [], "hosts no expert")
    raises(moe_check([[0, 1], [2, 3], [4, 5], [6, 8]]), "stages[0].experts[3]", [6, 8], "[8] out of range 0..7")
    raises(moe_check([[0, 1], [1, 3], [4, 5], [6, 7]]), "stages[0].experts", [[0, 1], [1, 3], [4, 5], [6, 7]],
           "placed more than once [1], nowhere [2]")


def test_check_schedules():
    two = [stage([0, 2], rep([0]), rep([1])), stage([2, 4], rep([2]), rep([3]))]
    raises(check(two, num_microbatches=1), "num_microbatches", 1, "1 < 2 stages")
    check(two, num_microbatches=1, schedule="GPipe")()
    a, b = [rep([0]), rep([1])], [rep([2]), rep([3])]
    inter = [stage([0, 1], *a), stage([1, 2], *b), stage([2, 3], *a), stage([3, 4], *b)]
    check(inter, schedule="Interleaved1F1B", num_microbatches=4)()
    raises(check(inter, schedule="Interleaved1F1B", num_microbatches=5), "num_microbatches", 5,
           "max(1, 5 // 2) = 2")
    raises(check(inter, schedule="1F1B", num_microbatches=4), "stages[2].replicas[0].ranks", [0],
           "rank 0 is also in stages[0].replicas[0]")
    v = [stage([0, 1], *a), stage([1, 2], *b), stage([2, 3], *b), stage([3, 4], *a)]
    check(v, schedule="ZBVZeroBubble", num_microbatches=4)()
    raises(check(inter, schedule="ZBVZeroBubble", num_microbatches=4), "stages", "4 stages on 2 rank groups",
           "in a V", "[0, 1, 0, 1]")
    raises(check(v, schedule="Interleaved1F1B", num_microbatches=4), "stages", "4 stages on 2 rank groups",
           "round-robin", "[0, 1, 1, 0]")


def test_example_plans_load_and_check():
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "examples"
    tiny = ModelConfig.from_toml(root / "models" / "tiny.toml")
    plans = {p.name: Plan.load(p) for p in sorted((root / "plans").glob("*.toml"))}
    assert set(plans) == {"tiny-dp-3+1.toml", "tiny-pp-3+1.toml"}
    for p in plans.values():
        p.check(T31, tiny)
    assert [r.microbatch for r in plans["tiny-dp-3+1.toml"].stages[0].replicas] == [3, 2, 2, 1]
    assert [r.microbatch for r in plans["tiny-pp-3+1.toml"].stages[1].replicas] == [5, 3]
