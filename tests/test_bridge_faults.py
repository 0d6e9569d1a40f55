"""No hangs: a rank frozen or killed mid-collective, on either side of the bridge, makes every other rank
raise a typed bridge error naming the op and its sequence number within timeout + grace.

One 2+2 pool (cuda:2, ascend:2, emulated). Each case builds a fresh `hetero` group with a 2 s timeout
(the group of the previous case is broken, as a group is after a failure), runs one healthy all_reduce
(#0) and then one (#1) in which the victim freezes (sleeps with its connections open) or dies
(os._exit) at a named point (`hal.ccl_bridge.faults`). The kill case runs last: it leaves the pool with a
dead worker. Bounds: TIMEOUT + GRACE (the bridge's own promise) + SLACK for a loaded CI machine; a
hang would instead run into the pool's 60 s limit.
"""
import pytest

from hal.testing import WorkerPool

from . import _bridge_cases as cases

TIMEOUT = 2.0
GRACE = 1.0
SLACK = 2.0
FREEZE = TIMEOUT + GRACE + 1.5  # longer than any survivor may wait
N_RAIL = 100_000                # above HAL_BRIDGE_SMALL_BYTES: the rail path
N_LEADER = 10                   # the single-leader path


@pytest.fixture(scope="module")
def pool():
    env = {"HAL_EMULATE": "cuda:2,ascend:2", "HAL_CPU_CCL": "gloo", "HAL_BRIDGE_GRACE_S": str(GRACE),
           "HAL_BRIDGE_SMALL_BYTES": "4096"}
    with WorkerPool(4, env=env) as p:
        p.run(cases.setup, 30.0, timeout=120)
        yield p


def _check_survivors(outcomes, victim):
    for o in outcomes:
        if o.rank == victim:
            continue
        assert o.ok, f"rank {o.rank}: {o.error}"
        res = o.value
        assert res["type"] in ("BridgeTimeoutError", "BridgePeerError"), f"rank {o.rank}: {res}"
        # the same base as the chips' CCL errors (hal.emulation.shm): one type to catch on either side
        want = "CollectiveTimeoutError" if res["type"] == "BridgeTimeoutError" else "CollectivePeerError"
        assert res["hal_base"] == [want], f"rank {o.rank}: {res}"
        assert res["op"] == "all_reduce" and res["seq"] == 1, f"rank {o.rank}: {res}"
        assert "all_reduce" in res["error"] and "#1" in res["error"], res["error"]
        assert res["seconds"] <= TIMEOUT + GRACE + SLACK, f"rank {o.rank} took {res['seconds']:.1f}s: {res}"


@pytest.mark.parametrize("point,victim,n", [
    ("all_reduce.rail.cross", 2, N_RAIL),   # an ascend rank freezes between its intra step and the rail
    ("collective.start", 1, N_LEADER),      # a cuda rank never joins a leader-path all_reduce
])
def test_frozen_rank(pool, point, victim, n):
    outcomes = pool.run(cases.fault, point, "freeze", victim, n, TIMEOUT, FREEZE, timeout=60, check=False)
    _check_survivors(outcomes, victim)
    # the frozen rank's own caller is bounded too: its waiter gives up at timeout + grace
    frozen = outcomes[victim].value
    assert frozen["type"] == "BridgeTimeoutError" and frozen["seconds"] <= TIMEOUT + GRACE + SLACK, frozen
    # and a collective queued behind the stuck one gives up at once, naming itself (#2)
    queued = frozen["queued"]
    assert queued["type"] == "BridgePeerError" and queued["seq"] == 2 and queued["seconds"] < 1.0, queued


def test_killed_rank(pool):
    victim = 1  # a cuda rank dies on its way to the rail
    outcomes = pool.run(cases.fault, "all_reduce.rail.cross", "kill", victim, N_RAIL, TIMEOUT, timeout=60,
                        check=False)
    assert outcomes[victim].died
    _check_survivors(outcomes, victim)
    # its rail partner (rank 3) sees the connection reset: a peer error, not a timeout
    assert outcomes[3].value["type"] == "BridgePeerError", outcomes[3].value
