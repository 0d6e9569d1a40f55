"""Prerequisites (issue 28, item 4): a failed runtime prerequisite (the device count, each rank's
device, the chip's process group) marks what depends on it 'not run: prerequisite X failed', so a
plugin broken at the root gets its verdict in seconds, not the 48-minute bound, and every summary
starts with the root cause.

`bad_device_count_over` reports one device more than the node has; ranks bind LOCAL_RANK %
device_count(), so rank 1 binds the phantom device and never joins a group. Before the
prerequisites, `hal conformance --level all` on it was still running after 10 minutes (every
multi-rank check waited a group timeout for rank 1); now `--level all` ends in about 12 s here
(2 ranks; 35 s wall for the CLI at its default 4 ranks: contract, runtime, ops and rank 0's perf
run, 900+ dependent checks are not run).
"""
import json
import time

import pytest

from hal.cli import main as hal_main
from hal.conformance.checks import LEVELS, PREREQUISITES, Check, prerequisites_of
from hal.conformance.runner import PoolHandle
from hal.conformance.suite import run_suite
from hal.conformance.target import load_target

OVER = "tests.broken_plugins.bad_device_count_over"
NOT_RUN = "not run: prerequisite runtime.device_count failed: device_count() = 2"


@pytest.fixture(scope="module")
def pool():
    with PoolHandle(2) as handle:
        yield handle


def test_which_checks_depend_on_which_prerequisite():
    def check(cid, where="rank0"):
        return Check(cid, cid.split(".")[0], "", lambda ctx: None, where=where)

    assert prerequisites_of(check("runtime.device_count")) == ()
    assert prerequisites_of(check("runtime.rank_devices", "all")) == ("runtime.device_count",)
    assert prerequisites_of(check("runtime.process_group", "all")) == PREREQUISITES[:2]
    for cid in ("collectives.all_reduce.float32.sum", "bridge.hetero_group", "errors.collective_timeout",
                "perf.collective_busbw"):
        assert prerequisites_of(check(cid, "all")) == PREREQUISITES
    assert prerequisites_of(check("runtime.device_selection")) == ("runtime.device_count",)
    assert prerequisites_of(check("errors.device_index_out_of_range")) == ("runtime.device_count",)
    for cid in ("runtime.synchronize", "ops.rms_norm.float32", "perf.matmul", "errors.op_wrong_dtype"):
        assert prerequisites_of(check(cid)) == ()  # rank 0's own device does not depend on the count
    assert prerequisites_of(check("contract.registers", "local")) == ()


def test_level_all_on_an_over_reported_device_count_ends_fast_root_cause_first(pool, tmp_path):
    target = load_target(OVER, nproc=2)  # the default --timeout 60: nothing here waits for it
    t0 = time.monotonic()
    report = run_suite(target, LEVELS, pool=pool)
    seconds = time.monotonic() - t0
    assert seconds < 300, seconds  # about 30 s on a 2-core host; the bound before was 48 min
    assert not report.ok
    res = {r.id: r for r in report.results}
    root = res["runtime.device_count"]
    assert root.status == "failed" and "device_count() = 2, but device 1 cannot be used" in root.message
    assert "over-reported" in root.message and "invalid device ordinal" in root.message
    # What depends on it is not run, naming it; nothing else is failed for it.
    dependent = [r for r in report.results if r.level in ("collectives", "bridge")] + [
        res[c] for c in ("runtime.rank_devices", "runtime.process_group", "runtime.device_selection",
                         "errors.collective_timeout", "errors.device_index_out_of_range", "perf.collective_busbw")]
    assert len(dependent) > 100
    for r in dependent:
        assert r.status == "skipped" and r.message.startswith(NOT_RUN), (r.id, r.status, r.message)
    assert [r.id for r in report.results if r.status == "failed"] == ["runtime.device_count"]
    # What does not depend on it still ran: rank 0's device is real.
    for cid in ("contract.registers", "runtime.synchronize", "runtime.memory_stats", "ops.matmul.float32",
                "errors.op_wrong_dtype", "perf.matmul"):
        assert res[cid].status == "passed", (cid, res[cid].message)
    # The first line of every summary names the root cause.
    rc = report.root_cause
    assert rc is not None and rc["id"] == "runtime.device_count" and rc["not_run"] == report.summary["skipped"]
    first = report.console().splitlines()[0]
    assert first.startswith("ROOT CAUSE: runtime.device_count failed: device_count() = 2"), first
    assert f"({rc['not_run']} check(s) that depend on it not run)" in first
    assert report.markdown().splitlines()[0].startswith("**ROOT CAUSE: runtime.device_count failed")
    assert "ROOT CAUSE: runtime.device_count failed" in report.html().split("<h1>")[0]
    report.write_json(tmp_path / "r.json")
    summary = json.loads((tmp_path / "r.json").read_text())["summary"]
    assert list(summary)[0] == "root_cause" and summary["root_cause"]["id"] == "runtime.device_count"
    assert summary["failed"] == 1


def test_a_rank_that_cannot_bind_fails_a_multi_rank_check_at_once(pool):
    """Without the device-count check in the run: rank 1's binding fails, and the multi-rank
    prerequisite fails at once naming it (rank 0 does not wait a group timeout for it); the
    collectives after it are not run."""
    target = load_target(OVER, nproc=2)
    select = ["runtime.rank_devices", "runtime.process_group", "collectives.all_reduce.float32.sum"]
    report = run_suite(target, ["runtime", "collectives"], select, pool=pool)
    res = {r.id: r for r in report.results}
    bound = res["runtime.rank_devices"]
    assert bound.status == "failed" and bound.message.startswith("rank 1: could not bind chip"), bound.message
    assert "invalid device ordinal" in bound.message
    assert bound.duration_s < 30, bound.duration_s  # not a group timeout (60 s)
    for cid in select[1:]:
        assert res[cid].status == "skipped"
        assert res[cid].message.startswith("not run: prerequisite runtime.rank_devices failed: rank 1: could not bind")
    assert report.root_cause["id"] == "runtime.rank_devices"


def test_the_cpu_plugin_passes_the_prerequisites(pool):
    report = run_suite(load_target("cpu", nproc=2), ["runtime"], list(PREREQUISITES), pool=pool)
    assert [(r.id, r.status) for r in report.results] == [(p, "passed") for p in PREREQUISITES], report.console()
    assert report.root_cause is None and report.console().startswith("hal conformance: plugin cpu")
    assert "root_cause" not in report.as_json()["summary"]


def test_the_cli_exits_1_and_its_summary_starts_with_the_root_cause(capsys):
    rc = hal_main(["conformance", "--plugin", OVER, "--level", "runtime", "--nproc", "2"])
    out = capsys.readouterr().out
    assert rc == 1, out
    summary = out[out.index("ROOT CAUSE:"):].splitlines()
    assert summary[0].startswith("ROOT CAUSE: runtime.device_count failed: device_count() = 2"), out
    assert summary[1].startswith("hal conformance: plugin bad_device_count_over")
