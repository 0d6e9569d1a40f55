"""The native lane: the bridge's device path (pinned staging, DeviceSync) under test.

- Everywhere (CI): a 4-rank `hetero` group (cuda:2 + ascend:2, emulated, HAL_BRIDGE_FORCE_STAGING=1)
  whose fabric's staging pool and DeviceSync are those of a *native* chip, on the stand-in streams,
  events and pinning of tests/stand_ins/_stand_in_streams.py: collectives are checked for values, the
  executor threads must synchronise on this rank's device (not device 0), every host staging slot
  must be pinned and reserved up front (no allocation per call), and DDP must match the
  single-process reference. The tensors are CPU tensors: what runs natively is the bridge's code
  path, not a device.
- Where a GPU exists (marker `native`): one native CUDA rank plus three cpu ranks in one `hetero`
  group, through a collective matrix and DDP parity. Skipped where torch sees no CUDA device.
"""
from __future__ import annotations

import pytest
import torch

from hal.testing import WorkerPool

from .stand_ins import native_lane_cases as cases

HAS_GPU = torch.cuda.is_available()


@pytest.fixture(scope="module")
def standin_pool():
    env = {"HAL_EMULATE": "cuda:2,ascend:2", "HAL_BRIDGE_FORCE_STAGING": "1", "HAL_CPU_CCL": "gloo"}
    with WorkerPool(4, env=env) as pool:
        setup = pool.run(cases.standin_setup, timeout=120)
        yield pool, setup


def test_standin_native_path_is_what_runs(standin_pool):
    _, setup = standin_pool
    assert all(s["type"] == "HeteroProcessGroup" and s["native_sync"] and s["force_staging"] for s in setup)
    assert [s["device_index"] for s in setup] == [0, 1, 0, 1]


def test_standin_collectives_sync_on_the_rank_device_with_pinned_staging(standin_pool):
    pool, _ = standin_pool
    out = pool.run(cases.standin_collectives, timeout=180)
    for r, o in enumerate(out):
        assert not o["failures"], (r, o["failures"])
        # DeviceSync ran on the executor threads: an event recorded and synchronised per collective,
        # on this rank's device (the executor binds it; a thread's default would be device 0).
        assert o["executor_records"] > 0 and o["executor_syncs"] >= o["executor_records"]
        assert o["executor_devices"] == [o["device_index"]], o
        assert o["caller_records"] > 0  # the caller's stream is waited for before the job starts
        # Host staging: every slot pinned, reserved at group creation, nothing allocated per call.
        assert o["host_slots"] > 0 and o["unpinned_host_slots"] == [], o["unpinned_host_slots"]
        before, warm, after = o["allocations"]
        assert after == warm, o["allocations"]


def test_standin_native_path_ddp_parity(standin_pool):
    pool, _ = standin_pool
    for r, o in enumerate(pool.run(cases.standin_ddp, timeout=180)):
        assert o["max_param_diff"] < 1e-5, (r, o["max_param_diff"])


@pytest.mark.native
@pytest.mark.skipif(not HAS_GPU, reason="needs a native NVIDIA GPU (one native cuda rank + cpu ranks)")
def test_native_cuda_rank_in_a_hetero_group():
    env = [{"HAL_CHIP": "cuda"}] + [{"HAL_CHIP": "cpu"}] * 3  # 4 ranks: the DDP batch of 8 splits evenly
    with WorkerPool(4, env=env) as pool:
        setup = pool.run(cases.gpu_setup, timeout=180)
        assert [(s["chip"], s["emulated"]) for s in setup] == [("cuda", False)] + [("cpu", False)] * 3
        assert all(s["group"] == "HeteroProcessGroup" for s in setup)
        for r, o in enumerate(pool.run(cases.gpu_matrix, timeout=300)):
            print(f"\n[native] rank {r}: {o['checks']} checks")
            assert o["checks"] > 0 and not o["failures"], (r, o["failures"])
        for r, o in enumerate(pool.run(cases.gpu_ddp, timeout=300)):
            print(f"[native] rank {r}: DDP max param diff {o['max_param_diff']:.3g}")
            assert o["max_param_diff"] < 1e-4, (r, o)
