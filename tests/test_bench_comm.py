"""`hal bench comm`: the nccl-tests arithmetic, the correctness check's teeth, and one tiny end-to-end run
through the CLI (it relaunches itself under torchrun: 2 emulated ranks of different chips, 2 sizes)."""
import json

import pytest
import torch

from hal.bench.comm import OpCase
from hal.bench.harness import BenchError, parse_size, size_ladder
from hal.core.efficiency import UnknownCollectiveError
from hal.core.efficiency import busbw_factor as bus_factor
from hal.cli import main

BACKEND = "hetero"
EMULATE = "cuda:1,ascend:1"


def test_nccl_tests_bus_factors():
    assert bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert bus_factor("all_gather", 4) == bus_factor("reduce_scatter", 4) == bus_factor("all_to_all", 4) == 0.75
    assert bus_factor("broadcast", 4) == bus_factor("reduce", 8) == bus_factor("send_recv", 2) == 1.0
    with pytest.raises(UnknownCollectiveError, match="unknown op 'gather'"):
        bus_factor("gather", 4)


def test_sizes():
    assert parse_size("4K") == 4096 and parse_size("256M") == 256 << 20 and parse_size("1G") == 1 << 30
    assert parse_size("1000") == 1000 and parse_size("64MiB") == 64 << 20
    assert size_ladder(4096, 65536) == [4096, 8192, 16384, 32768, 65536]
    assert size_ladder(4096, 65536, 4) == [4096, 16384, 65536]
    with pytest.raises(BenchError, match=r"'4Q' is not a byte count"):
        parse_size("4Q")
    with pytest.raises(BenchError, match=r"--min-bytes \(8192\) <= --max-bytes \(4096\)"):
        size_ladder(8192, 4096)


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_check_counts_exactly_the_corrupted_elements(op, dtype):
    # rank 1 of 3 (reduce: the root, rank 0), no process group needed: put the exact answer in place,
    # then break 3 elements
    rank = 0 if op == "reduce" else 1
    case = OpCase(op, 3 * 40, dtype, group=None, rank=rank, n=3, device=torch.device("cpu"))
    case.out.copy_(case.expected().to(dtype))
    assert case.wrong() == 0
    case.out[[0, 5, -1]] += 1
    assert case.wrong() == 3


@pytest.mark.parametrize("n", [2, 3, 4])
def test_uneven_all_to_all_splits_and_check(n):
    """--uneven: every rank sends its whole buffer, in blocks that differ by destination; what each
    rank receives is the matching column; the check still counts exactly the corrupted elements."""
    count = n * 50
    cases = [OpCase("all_to_all", count, torch.float32, group=None, rank=r, n=n, device=torch.device("cpu"),
                    uneven=True) for r in range(n)]
    for r, case in enumerate(cases):
        sent = [case.split(r, j) for j in range(n)]
        assert sum(sent) == count and case.inp.numel() == count and len(set(sent)) > 1
        assert case.out.numel() == sum(case.split(j, r) for j in range(n))
        # what rank r receives from j is what j's own inputs hold for r
        want = torch.cat([cases[j].inp[sum(cases[j].split(j, i) for i in range(r)):][:case.split(j, r)]
                          for j in range(n)])
        assert torch.equal(case.expected().float(), want)
        case.out.copy_(want)
        assert case.wrong() == 0
        case.out[[0, -1]] += 1
        assert case.wrong() == 2
    with pytest.raises(BenchError, match="--uneven applies to --op all_to_all only, got --op all_gather"):
        OpCase("all_gather", count, torch.float32, group=None, rank=0, n=n, device=torch.device("cpu"), uneven=True)


def test_cli_all_to_all_against_flat_gloo(capfd):
    """`hal bench comm --op all_to_all --uneven --baseline gloo` on 2+2 emulated ranks (the rail path
    with relays): both tables, #wrong 0 on both backends."""
    argv = ["bench", "comm", "--op", "all_to_all", "--uneven", "--baseline", "gloo", "--emulate", "cuda:2,ascend:2",
            "--min-bytes", "64K", "--max-bytes", "64K", "--iters", "2", "--warmup", "1", "--repeats", "2",
            "--timeout", "60"]
    code = main(argv)
    captured = capfd.readouterr()
    assert code == 0, captured.out + captured.err
    text = captured.out
    assert "all_to_all (uneven splits) on backend hetero" in text
    assert "speedup = gloo time / hetero time" in text and "# Out of bounds values : 0 OK" in text
    rows = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    assert rows[0][0] == "65536" and rows[0][-1] == "0"          # hetero row: size ... #wrong
    assert rows[1][0] == "65536" and rows[1][-1] == "0"          # baseline row: size hetero gloo speedup #wrong


def test_cli_end_to_end(tmp_path, capfd):
    # `hal bench comm ...` called in this process (its torch import is already paid); it relaunches
    # itself under torchrun, whose ranks print the table to the inherited stdout
    out = tmp_path / "rows.json"
    argv = ["bench", "comm", "--backend", BACKEND, "--emulate", EMULATE, "--min-bytes", "4K", "--max-bytes", "8K",
            "--iters", "2", "--warmup", "1", "--repeats", "3", "--timeout", "60", "--json", str(out),
            "--model", "--nic-rate", "200Mb/s", "--intra-rate", "inf"]
    code = main(argv)
    captured = capfd.readouterr()
    assert code == 0, captured.out + captured.err
    text = captured.out
    assert "EMULATED chips" in text and "cuda (emulated) x1, ascend (emulated) x1" in text
    table = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    table, model = table[:2], table[2:]
    assert [int(r[0]) for r in table] == [4096, 8192]
    assert [r[2] for r in table] == ["float32", "float32"] and [r[-1] for r in table] == ["0", "0"]
    assert "# Out of bounds values : 0 OK" in text
    report = json.loads(out.read_text())
    assert report["backend"] == BACKEND and report["world_size"] == 2 and report["emulated"] is True
    assert [c["chip"] for c in report["chips"]] == ["cuda", "ascend"]
    rows = report["rows"]
    assert [r["size_bytes"] for r in rows] == [4096, 8192] and [r["count"] for r in rows] == [1024, 2048]
    for r in rows:
        assert r["wrong"] == 0 and len(r["repeats_us"]) == 3 and r["time_us"] > 0
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 1.0)  # 2(n-1)/n = 1 for n = 2
        assert r["algbw_GBps"] == pytest.approx(r["size_bytes"] / r["time_us"] / 1e3)
    # --model: hal.core.link_model on 1 cuda + 1 ascend rank of one node at 200 Mb/s = 25e6 B/s per NIC
    # direction: the one rail's ring all_reduce sends S each way across the NICs, S / 25e6 s
    assert "# link model (hal.core.link_model" in text and [int(r[0]) for r in model] == [4096, 8192]
    assert [m["model_us"] for m in report["link_model"]["rows"]] == pytest.approx([4096 / 25.0, 8192 / 25.0])
    assert [float(r[1]) for r in model] == pytest.approx([163.8, 327.7], abs=0.05)
