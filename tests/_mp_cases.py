"""Functions the worker-pool self-test runs on every rank (must be importable by module path)."""
import os


def whoami():
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), os.environ.get("HAL_EMULATE")


def fail_on(rank_to_fail):
    if int(os.environ["RANK"]) == rank_to_fail:
        raise ValueError(f"rank {rank_to_fail} fails on purpose")
    return "ok"


def die_on(rank_to_die):
    if int(os.environ["RANK"]) == rank_to_die:
        os._exit(3)
    return "ok"


def sleep(seconds):
    import time
    time.sleep(seconds)
