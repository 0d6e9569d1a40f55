"""hal/bench/harness.py, the one harness every benchmark shares: slowest-rank medians, nccl-tests
bandwidths (factors from hal.core.efficiency, the one definition), and the candidate/baseline table."""
import pytest

from hal.bench.harness import BenchError, Row, bandwidths, comparison_lines, median_us, slowest_median
from hal.core.efficiency import BUSBW_FACTOR, UnknownCollectiveError, busbw_factor


def test_slowest_rank_per_repeat_then_median():
    # rank r, repeat i: the repeat lasts as long as its slowest rank
    t, per_repeat = slowest_median([[1.0, 5.0, 3.0], [2.0, 1.0, 4.0]])
    assert per_repeat == [2.0, 5.0, 4.0] and t == 4.0
    with pytest.raises(BenchError, match=r"different repeat counts \[2, 1\]"):
        slowest_median([[1.0, 2.0], [1.0]])
    with pytest.raises(BenchError, match="no timings"):
        slowest_median([])


def test_bandwidths_follow_nccl_tests():
    algbw, busbw = bandwidths("all_reduce", 8_000_000_000, 2.0, 4)
    assert algbw == 4.0 and busbw == pytest.approx(4.0 * 2 * 3 / 4)
    assert bandwidths("all_gather", 10**9, 1.0, 8)[1] == pytest.approx(7 / 8)
    assert bandwidths("broadcast", 10**9, 1.0, 8)[1] == pytest.approx(1.0)
    assert set(BUSBW_FACTOR) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
                                 "send_recv"}
    with pytest.raises(UnknownCollectiveError, match="n=0"):
        busbw_factor("all_reduce", 0)


def _row(size, t_us, busbw, wrong=0, group="world"):
    return Row(op="all_reduce", size_bytes=size, count=size // 4, dtype="float32", redop="sum", root=-1,
               time_us=t_us, algbw_GBps=busbw, busbw_GBps=busbw, wrong=wrong, group=group)


def test_comparison_counts_the_slowest_group_and_both_wrong_counts():
    cand = [_row(4096, 10.0, 1.0), _row(8192, 20.0, 2.0, wrong=1)]
    base = [_row(4096, 40.0, 0.25, group="a"), _row(4096, 50.0, 0.2, group="b"), _row(8192, 30.0, 1.0)]
    head, small, big = comparison_lines(cand, base, "shm", "gloo")
    assert "shm busbw" in head and "speedup" in head
    assert small.split()[0] == "4096" and small.split()[-2:] == ["5.00x", "0"]   # 50 / 10: slowest group b
    assert big.split()[-2:] == ["1.50x", "1"]


def test_median_us_times_calls():
    calls = []
    t = median_us(lambda: calls.append(1), calls=50, repeats=3, warmup=10)
    assert t > 0 and len(calls) == 10 + 3 * 50
