"""The bridge across two emulated hosts (network namespaces, one shaped NIC per rank, a bridge switch),
launched by torchrun with one agent per host: 2 hosts x 2 ranks, emulated cuda on host 0 and
emulated ascend on host 1.

One job runs the checks that need a healthy bed (host identity and the CPU fabric HAL_CPU_CCL=auto
chooses, NIC binding, a reduced collective matrix, DDP parity); one job runs on a 5% loss link and
then has that link taken down mid-collective; one job has a host killed (last: the host does not
come back). Few jobs, because each pays torchrun's and four ranks' start-up. A fault
outcome passes when every affected rank ends with a typed bridge error within timeout + grace
(+ SLACK for a loaded machine) or with the correct result; a hang would run into the job's wall
bound, which fails the test. Every job is bounded (WALL); the fixture checks nothing is left.
Needs root (skips otherwise). Emulated: the chips (CPU tensors); native: namespaces, veths, the
bridge, tc tbf shaping, iptables loss, TCP, torchrun's multi-node rendezvous.
"""
import pytest

from hal.testbed import BedSpec, LinkShape, TestbedUnavailable, parse_rate

from ._testbed_fixture import make_bed_fixture, run_cases, wait_phase

pytestmark = pytest.mark.slow

RATE = "400 Mb/s"
CHIPS = ["cuda", "cuda", "ascend", "ascend"]
WALL = 150.0          # seconds a whole job may take (start-up of 4 ranks on a loaded 2-core machine)
TIMEOUT, GRACE, SLACK = 4.0, 2.0, 4.0
TYPED = ("BridgeTimeoutError", "BridgePeerError", "BridgeCollectiveError")   # hal.ccl_bridge.errors

bed = make_bed_fixture(lambda: BedSpec.of([2, 2], rate=RATE, chips=CHIPS))

MATRIX = [
    ("all_reduce+reduce", ["float32", "bfloat16", "int32"], ["sum", "max"], [7, 70_000]),
    ("reduce_scatter", ["float32"], ["sum"], [8, 70_000]),
    ("all_gather", ["float32", "int8"], ["sum"], [5, 70_000]),
    ("broadcast", ["float32"], ["sum"], [7, 70_000]),
    ("all_to_all", ["float32"], ["sum"], [8, 70_000]),
    ("send_recv", ["float32"], ["sum"], [7, 70_000]),
]


@pytest.fixture(scope="module")
def healthy(bed):
    """The healthy-bed job, run once: identity, groups, sockets, the matrix, DDP, sockets again."""
    before = {h: bed.nic_bytes(h) for h in range(2)}
    # sockets right after the groups are made (alive for sure) and again at the end
    cases = [["identity"], ["tests._bridge_cases:setup", 60.0], ["sockets"]]
    cases += [["tests._bridge_cases:matrix", c, d, o, s] for c, d, o, s in MATRIX]
    cases += [["tests._strategy_cases:train_ddp"], ["sockets"]]
    result, per_rank = run_cases(bed, cases, timeout_s=60.0, wall_s=WALL)
    assert result.ok and sorted(per_rank) == [0, 1, 2, 3], f"{result.describe()}\n{result.tail()}"
    after = {h: bed.nic_bytes(h) for h in range(2)}
    return per_rank, before, after


def _value(per_rank, rank, case_index):
    rec = per_rank[rank][case_index]
    assert rec["ok"], f"rank {rank} case {rec['case']}: {rec.get('error_type')}: {rec.get('error')}\n{rec.get('traceback')}"
    return rec["value"]


def test_each_host_is_a_host_and_auto_picks_shm_inside_gloo_across(bed, healthy):
    per_rank, _, _ = healthy
    ids = {r: _value(per_rank, r, 0) for r in range(4)}
    # torchrun's static rendezvous: host h holds the ranks after hosts 0..h-1, in the spec's order
    assert [ids[r]["node_rank"] for r in range(4)] == [0, 0, 1, 1], ids
    assert [ids[r]["chip"] for r in range(4)] == CHIPS and all(i["emulated"] for i in ids.values())
    assert [ids[r]["hostname"] for r in range(4)] == [bed.hostname(0)] * 2 + [bed.hostname(1)] * 2
    # what hal.emulation.shm.host compares: one kernel (same boot id), but /dev/shm and pid namespace per host
    assert len({i["boot_id"] for i in ids.values()}) == 1
    for a, b in ((0, 1), (2, 3)):
        assert (ids[a]["shm_dev"], ids[a]["pid_ns"]) == (ids[b]["shm_dev"], ids[b]["pid_ns"])
    assert ids[0]["shm_dev"] != ids[2]["shm_dev"] and ids[0]["pid_ns"] != ids[2]["pid_ns"]
    # HAL_CPU_CCL=auto: shared memory inside each host's sub-cluster, gloo on the rails across hosts
    assert all(i["hal_cpu_ccl"] == "auto" for i in ids.values())
    assert all(i["intra_pg"] == "ShmProcessGroup" for i in ids.values()), ids
    assert all(set(i["rails"].values()) == {"ProcessGroupGloo"} for i in ids.values()), ids


def test_rails_use_each_ranks_own_nic(bed, healthy):
    per_rank, before, after = healthy
    ids = {r: _value(per_rank, r, 0) for r in range(4)}
    assert [ids[r]["gloo_ifname"] for r in range(4)] == ["rail0", "rail1", "rail0", "rail1"]
    socks = {r: per_rank[r][2]["value"] + per_rank[r][-1]["value"] for r in range(4)}
    addr = {0: bed.spec.address(0, 0), 1: bed.spec.address(0, 1), 2: bed.spec.address(1, 0), 3: bed.spec.address(1, 1)}
    for a, b in ((0, 2), (1, 3)):   # the two rails: every socket between the members is NIC to NIC
        pairs = [(l, r) for l, r in socks[a] if r.split(":")[0] == addr[b]]
        assert pairs and all(l.split(":")[0] == addr[a] for l, _ in pairs), (a, b, socks[a])
    # every NIC carried the rails' traffic both ways (the matrix + DDP move megabytes per rail)
    for h in range(2):
        for nic in ("rail0", "rail1"):
            tx = after[h][nic][0] - before[h][nic][0]
            rx = after[h][nic][1] - before[h][nic][1]
            assert tx > 1_000_000 and rx > 1_000_000, (h, nic, tx, rx)


@pytest.mark.parametrize("i,coll", [(3 + i, c[0]) for i, c in enumerate(MATRIX)])
def test_bridge_matrix_across_hosts(healthy, i, coll):
    per_rank, _, _ = healthy
    total = 0
    for r in range(4):
        v = _value(per_rank, r, i)
        assert not v["failures"], f"rank {r} {coll}: {v['failures'][:10]}"
        assert v["rail_mode"] is True
        total += v["checks"]
    assert total > 0


def test_ddp_matches_single_process_across_hosts(healthy):
    per_rank, _, _ = healthy
    for r in range(4):
        v = _value(per_rank, r, 3 + len(MATRIX))
        worst = {n: d for n, d in v["param_diffs"].items() if d > 1e-5}
        assert not worst, f"rank {r}: parameters off the single-process run: {worst}"
        assert min(v["moved"].values()) >= 1e-4, "parameters that barely trained"
        assert v["losses"] == pytest.approx(v["ref_losses"], abs=1e-5)


def _check_fault(per_rank, ranks, case=0, allow_ok=True):
    for r in ranks:
        recs = per_rank.get(r)
        assert recs and len(recs) > case and recs[case]["ok"], f"rank {r}: no result or the case raised: {recs}"
        v = recs[case]["value"]
        if v["outcome"] == "ok" and allow_ok:
            continue
        assert v["outcome"] == "error", f"rank {r}: {v}"   # never "wrong"
        # typed: a bridge error, or the error of the inner CCL it came from (e.g. hal.emulation.shm's
        # ShmPeerDiedError when the peer on the same host gave up first), naming the op
        assert v["type"] in TYPED or "HalError" in v["mro"], f"rank {r}: untyped error {v}"
        assert v["op"] and v["op"] in v["error"], f"rank {r}: the error does not name its op: {v}"
        assert v["seconds"] <= TIMEOUT + GRACE + SLACK, f"rank {r} took {v['seconds']:.1f}s: {v}"


def test_lossy_link_then_link_down_mid_collective(bed):
    """One job, two cases. First 5% loss on host 1's NIC 0 (rail 0): all_reduce must complete
    correctly (TCP retransmits) or fail typed. Then the loss is lifted and, during a long series of
    all_reduces, the same NIC's cable is pulled: every rank must fail typed within timeout + grace."""
    rate = parse_rate(RATE)
    try:
        bed.set_shape(1, 0, LinkShape(rate_bps=rate, loss=0.05))
    except TestbedUnavailable as exc:   # no iptables on this machine
        pytest.skip(f"lossy link unavailable: {exc}")
    drops = {}

    def faults(job):
        drops["start"] = bed.loss_drops(1)
        ok = wait_phase(bed, "done0", [0, 1, 2, 3], WALL - 30)
        drops["end"] = bed.loss_drops(1)
        bed.set_shape(1, 0, LinkShape(rate_bps=rate))
        assert ok, "the lossy case did not finish on every rank"
        assert wait_phase(bed, "pull", [0, 1, 2, 3], WALL - 30), "ranks never reached the second case"
        bed.link_down(1, 0)   # rail 0 (ranks 0 and 2) loses its cable
    cases = [["long_all_reduce", 1 << 20, 8, 30.0, "lossy"], ["long_all_reduce", 1 << 20, 100_000, TIMEOUT, "pull"]]
    try:
        result, per_rank = run_cases(bed, cases, 60.0, WALL, {"HAL_BRIDGE_GRACE_S": str(GRACE)}, faults)
    finally:
        bed.set_shape(1, 0, LinkShape(rate_bps=rate))
        bed.link_up(1, 0)
    assert not result.timed_out, f"the job hung: {result.describe()}\n{result.tail()}"
    assert drops["end"] > drops["start"], f"the loss rule dropped nothing: the link was not lossy {drops}"
    _check_fault(per_rank, [0, 1, 2, 3], case=0)
    _check_fault(per_rank, [0, 1, 2, 3], case=1, allow_ok=False)


def test_killed_host(bed):
    """Last in the module: host 1 (both ascend ranks) is killed mid-collective and stays dead."""
    def kill(job):
        assert wait_phase(bed, "long", [0, 1, 2, 3], WALL - 30), "ranks never reached the collective"
        bed.kill_host(1)
    env = {"HAL_BRIDGE_GRACE_S": str(GRACE)}
    result, per_rank = run_cases(bed, [["long_all_reduce", 1 << 20, 100_000, TIMEOUT]], 60.0, WALL, env, kill)
    assert not result.timed_out, f"the job hung: {result.describe()}\n{result.tail()}"
    _check_fault(per_rank, [0, 1], allow_ok=False)
    assert 2 not in per_rank and 3 not in per_rank
    assert result.hosts[0].returncode is not None and result.hosts[1].returncode != 0
