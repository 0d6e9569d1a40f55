"""Run by tests/test_install_without_shm.py in a fresh interpreter whose sys.path starts with a
HAL_BUILD_SHM=0 install (not this checkout): prints one JSON line of what that install does."""
import json
import os
import sys
from datetime import timedelta


def rank_main() -> dict:
    """Every rank of a WorkerPool: the CPU fabric HAL_CPU_CCL=auto picks, and an all_reduce over it."""
    import torch
    import torch.distributed as dist

    from hal.emulation.emulate import create_cpu_process_group

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0,
                          timeout=timedelta(seconds=30))
    pg = create_cpu_process_group(store, rank, world, timedelta(seconds=30))
    x = torch.full((4,), float(rank + 1))
    pg.allreduce([x]).wait()
    return {"group": type(pg).__name__, "sum": x[0].item()}


def main() -> None:
    import hal
    import hal.emulation.shm
    from hal.emulation.shm import ShmSetupError, create_shm_process_group
    from hal.testing import WorkerPool

    out = {"hal_file": hal.__file__, "available": hal.emulation.shm.available()}
    import torch.distributed as dist
    try:
        create_shm_process_group(dist.HashStore(), 0, 1, timedelta(seconds=5))
        out["shm_error"] = None
    except ShmSetupError as exc:
        out["shm_error"] = f"{type(exc).__name__}: {exc}"
    with WorkerPool(2, env={"HAL_CPU_CCL": "auto", "OMP_NUM_THREADS": "1"}) as pool:
        out["ranks"] = pool.run(rank_main, timeout=90)
    acc = hal.accelerator("cpu")
    out["chip"] = acc.chip.name
    print("@@" + json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
