"""Regression: destroying `hetero` process groups neither raises nor aborts the process at exit.

Until commit ac65111 `hal demo` skipped `dist.destroy_process_group()` on `hetero`, because destroying a
default hetero group ended the rank with "terminate called without an active exception" (SIGABRT) at
interpreter exit. The workaround is gone from hal/cli/demo_job.py; this test holds the fix: 4 ranks
(emulated cuda:2 + ascend:2, so the bridge has two sub-clusters and rails), DDP through a default hetero
group, a hetero subgroup destroyed on its own, then the default group; then every rank process exits
and its exit code must be 0 (an abort at exit reads -6). Emulated chips on CPU, as everywhere here.
"""
from hal.testing import WorkerPool
from tests._destroy_cases import ddp_then_destroy

WORLD = 4


def test_destroy_hetero_groups_then_exit_cleanly():
    pool = WorkerPool(WORLD, env={"HAL_EMULATE": "cuda:2,ascend:2", "OMP_NUM_THREADS": "1"})
    try:
        out = pool.run(ddp_then_destroy, timeout=120)
        # The original symptom was at interpreter exit, so let every rank exit on its own: ask each
        # worker to stop and wait for it (pool.close() kills a worker still alive after 10 s, which a
        # loaded machine can reach with any torch process: -9 would then say nothing about hetero).
        # WorkerPool keeps its connections and processes private; their exit is what this test is about.
        for conn in pool._conns:
            conn.send(None)
        for proc in pool._procs:
            proc.join(120)
        codes = [proc.exitcode for proc in pool._procs]
    finally:
        pool.close(kill=True)
    assert [o["chip"] for o in out] == ["cuda", "cuda", "ascend", "ascend"]
    assert all(o["emulated"] for o in out)
    assert [o["sum"] for o in out] == [10.0] * WORLD          # 1 + 2 + 3 + 4 on every rank
    assert not any(o["initialized_after"] for o in out)
    # 0: a clean exit; -6: SIGABRT at exit (the old abort); None: still running after 120 s (a hang)
    assert codes == [0] * WORLD, f"rank exit codes {codes} (-6: SIGABRT at exit, None: hung at exit)"
