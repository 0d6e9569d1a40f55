"""CI runs the conformance suite on `cpu` (every level, 4 ranks: world sizes 2, 3 and 4) and on each
vendor plugin emulated (the core levels plus collectives, 2 ranks): `hal conformance --plugin X
[--emulate]` must pass; the bridge level runs with 2 ranks of the vendor chip (its own CCL) beside cpu.
An emulated chip's collectives run on the same CPU fabric as cpu's, so world sizes 3 and 4 (a
property of the fabric, checked on cpu) are not repeated per vendor: at world size 2 each vendor's
declared matrix is checked entry by entry, and every undeclared combination must be refused.

One worker pool handle serves every run (workers rebind per plugin), so process start-up and the
first call of each torch kernel are paid once per pool size (4 for cpu, 2 for the vendors, 3 for the
bridge).
"""
import json

import pytest

from hal.conformance.checks import LEVELS
from hal.core.efficiency import EfficiencyMatrix
from hal.conformance.runner import PoolHandle
from hal.conformance.suite import run_suite
from hal.conformance.target import load_target


@pytest.fixture(scope="module")
def pool():
    with PoolHandle(4) as handle:
        yield handle


def _assert_passes(report):
    failed = [f"{r.id}: {r.message}" for r in report.results if r.status == "failed"]
    assert not failed, "\n".join(failed)
    assert report.ok


def test_cpu_passes_every_level(pool, tmp_path):
    report = run_suite(load_target("cpu", nproc=4, group_timeout_s=30), LEVELS, pool=pool)
    _assert_passes(report)
    by_level = report.by_level()
    assert set(by_level) == set(LEVELS)
    for level in ("contract", "runtime", "ops", "collectives", "errors", "perf"):
        assert by_level[level]["passed"] > 0, (level, by_level[level])
    # A host chip: the device checks and the bridge do not apply; nothing is merely skipped.
    assert report.summary["skipped"] == 0
    assert {r.id for r in report.results if r.status == "not_applicable"} >= {
        "errors.op_wrong_device", "errors.device_index_out_of_range", "bridge.hetero_group"}
    res = {r.id: r for r in report.results}
    assert "world sizes [2, 3, 4]" in res["collectives.broadcast.float32"].message
    # The perf level wrote an efficiency matrix that validates against its model (and round-trips).
    em = report.efficiency_matrix
    assert isinstance(em, EfficiencyMatrix) and not em.emulated and em.chip == "cpu"
    assert em.matmul and em.memory_bandwidth and em.collectives
    path = tmp_path / "report.json"
    report.write_json(path)
    data = json.loads(path.read_text())
    assert set(data) == {"schema_version", "plugin", "chip", "emulated", "levels", "checks", "summary",
                         "efficiency_matrix"}
    EfficiencyMatrix.model_validate(data["efficiency_matrix"])
    assert data["summary"]["failed"] == 0 and data["summary"]["passed"] == len(
        [c for c in data["checks"] if c["status"] == "passed"])


@pytest.mark.parametrize("plugin", ["cuda", "ascend", "kunlun"])
def test_vendor_plugin_passes_emulated(plugin, pool):
    target = load_target(plugin, emulate=True, nproc=2, group_timeout_s=30)
    assert target.emulated and target.chip == plugin and target.world_sizes == (2,)
    report = run_suite(target, ["contract", "runtime", "ops", "errors", "collectives"], pool=pool)
    _assert_passes(report)
    assert report.summary["passed"] > 400
    # every combination was asked (none failed, above): declared ones gave the golden result at world
    # size 2, undeclared ones a typed refusal
    coll = [r for r in report.results if r.id.startswith("collectives.") and r.id.count(".") >= 2]
    assert any("refused as the hookspec asks" in r.message for r in coll), plugin
    assert any("cases correct at world sizes [2]" in r.message for r in coll), plugin


def test_bridge_level_puts_the_vendor_chip_and_cpu_in_one_hetero_group(pool):
    target = load_target("ascend", emulate=True, nproc=2, group_timeout_s=30)  # the bridge still gets 3 ranks
    report = run_suite(target, ["bridge"], ["bridge.hetero_group", "bridge.all_reduce.float32.*",
                                            "bridge.all_reduce.int32.avg", "bridge.all_to_all_single.int64",
                                            "bridge.broadcast.bfloat16"], pool=pool)
    _assert_passes(report)
    res = {r.id: r for r in report.results}
    assert "HeteroProcessGroup" in res["bridge.hetero_group"].message
    assert "'ascend'" in res["bridge.hetero_group"].message and "'cpu'" in res["bridge.hetero_group"].message
    assert "cases correct across the chips" in res["bridge.all_reduce.float32.sum"].message
    assert "3 ranks, 2 on ascend" in res["bridge.all_reduce.float32.sum"].message  # its own CCL is used
    assert "NotSupportedError" in res["bridge.all_reduce.int32.avg"].message  # a typed refusal, not a wrong sum
