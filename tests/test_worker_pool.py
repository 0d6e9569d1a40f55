"""The multi-process worker pool: env per rank, errors carry rank and traceback, deaths and timeouts."""
import pytest

from hal.testing import WorkerError, WorkerPool

from . import _mp_cases as cases


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(2, env=[{"HAL_EMULATE": "cuda:1,ascend:1"}, {"HAL_EMULATE": "cuda:1,ascend:1"}]) as p:
        yield p


def test_env_and_rank(pool):
    assert pool.run(cases.whoami) == [(0, 2, "cuda:1,ascend:1"), (1, 2, "cuda:1,ascend:1")]


def test_error_names_rank(pool):
    with pytest.raises(WorkerError, match="rank 1: ValueError: rank 1 fails on purpose"):
        pool.run(cases.fail_on, 1)
    outcomes = pool.run(cases.fail_on, 0, check=False)
    assert [o.ok for o in outcomes] == [False, True] and outcomes[0].error_type == "ValueError"


def test_death_and_timeout():
    with WorkerPool(2) as p:
        outcomes = p.run(cases.die_on, 1, check=False, timeout=30)
        assert outcomes[0].ok and outcomes[1].died
    p = WorkerPool(1)
    with pytest.raises(TimeoutError, match="sleep did not finish within 1"):
        p.run(cases.sleep, 30, timeout=1)
    assert p.alive() == [False]
