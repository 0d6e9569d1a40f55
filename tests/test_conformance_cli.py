"""`hal conformance` and `pytest -p hal.conformance`: exit codes, the three report formats, -k selection,
and the engine's guarantees (a hang or an abort fails one check and the pool is replaced).

Report formats are checked on synthetic results (no processes); the CLI runs in-process on the
contract level (no pool); the pytest plugin runs in a subprocess, as a vendor's CI would run it.
"""
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hal.conformance.checks import Check, CheckFailed, CheckResult, matches, parse_levels
from hal.core.efficiency import EfficiencyMatrix
from hal.conformance.report import Report
from hal.conformance.runner import PoolHandle, Runner
from hal.conformance.target import load_target
from hal.cli import main as hal_main


ROOT = Path(__file__).resolve().parents[1]


# ---- check functions for the engine test (module level: the worker pool imports them) ---------
def hangs(ctx):
    time.sleep(120)


def aborts(ctx):
    os.abort()


def fails_on_rank_1(ctx):
    if ctx.rank == 1:
        raise CheckFailed("expected 1, got 2")
    return "fine here"


def passes(ctx):
    return f"rank {ctx.rank} of {ctx.world_size} on {ctx.device}"


def _report(emulated=False):
    results = [CheckResult("contract.registers", "contract", "passed", "ok", 0.01),
               CheckResult("ops.rms_norm.float32", "ops", "failed", "expected |err| <= 1e-5, got 4.7 <b>", 0.2),
               CheckResult("bridge.hetero_group", "bridge", "skipped", "ccl_bridge not available", 0.0),
               CheckResult("errors.op_wrong_device", "errors", "not_applicable", "host tensors", 0.0)]
    return Report(plugin="acme", chip="acme", emulated=emulated, levels=["contract", "ops", "bridge", "errors"],
                  results=results, seconds=1.5)


def test_levels_and_selection():
    assert parse_levels("all")[0] == "contract" and len(parse_levels("all")) == 7
    assert parse_levels("ops,contract") == ["contract", "ops"]
    assert parse_levels("core") == ["contract", "runtime", "ops", "errors"]
    with pytest.raises(ValueError, match="unknown level"):
        parse_levels("opz")
    assert matches("ops.rms_norm.float32", ["rms_norm"]) and not matches("ops.silu.float32", ["rms_norm"])
    assert matches("collectives.all_reduce.int8.sum", ["collectives.*.int8.*"])


def test_json_markdown_html_junit_formats(tmp_path):
    r = _report(emulated=True)
    assert r.summary == {"passed": 1, "failed": 1, "skipped": 1, "not_applicable": 1} and not r.ok
    r.write_json(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert list(data) == ["schema_version", "plugin", "chip", "emulated", "levels", "checks", "summary",
                          "efficiency_matrix"]
    assert set(data["checks"][0]) == {"id", "level", "status", "message", "duration_s"}
    assert data["emulated"] is True and data["efficiency_matrix"] is None
    md = r.markdown()
    assert "EMULATED" in md and "| level | passed | failed | skipped | not applicable |" in md
    assert md.index("## Failures") < md.index("## Skipped") < md.index("## Not applicable") < md.index("## Passed")
    html = r.html()
    assert "&lt;b&gt;" in html and "<b>FAILED</b>" in html
    assert html.index("ops.rms_norm.float32") < html.index("contract.registers")  # failures first
    suite = ET.fromstring(r.junit_xml()).find("testsuite")
    assert suite.get("tests") == "4" and suite.get("failures") == "1" and suite.get("skipped") == "2"
    na = [c for c in suite if c.find("skipped") is not None and c.find("skipped").get("type") == "not_applicable"]
    assert [c.get("name") for c in na] == ["errors.op_wrong_device"]
    failed = [c for c in suite if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["ops.rms_norm.float32"]


def test_efficiency_matrix_model():
    base = dict(chip="x", plugin="x", profile_model="m", emulated=True, device="cpu", ccl="gloo",
                torch_version="2", host="h", measured_at="2026-01-01T00:00:00+00:00")
    em = EfficiencyMatrix(**base, collectives=[
        dict(collective="all_reduce", dtype="float32", bytes=1024, world_size=2, seconds_median=1e-3, algbw=1e6,
             busbw=1e6, repeats=3),
        dict(collective="all_reduce", dtype="float32", bytes=4096, world_size=2, seconds_median=1e-3, algbw=4e6,
             busbw=4e6, repeats=3)])
    assert em.busbw("all_reduce", 2048) == pytest.approx(2.5e6) and em.busbw("all_reduce", 1) == 1e6
    assert em.busbw("broadcast", 1024) is None and em.best_matmul_flops("float32") is None
    with pytest.raises(ValueError, match="schema 2.0"):
        EfficiencyMatrix(**base, schema_version="2.0")
    with pytest.raises(ValueError):
        EfficiencyMatrix(**base, matmul=[dict(dtype="float32", m=1, n=1, k=1, flops_per_s=-1.0, seconds_median=1,
                                              repeats=1)])


def test_cli_passes_and_writes_every_report(tmp_path, capsys):
    out = {k: tmp_path / f"r.{k}" for k in ("json", "md", "html", "xml")}
    rc = hal_main(["conformance", "--plugin", "cpu", "--level", "contract", "--json", str(out["json"]),
                   "--report", str(out["md"]), "--junitxml", str(out["xml"])])
    assert rc == 0, capsys.readouterr().out
    assert json.loads(out["json"].read_text())["summary"] == {"passed": 11, "failed": 0, "skipped": 0,
                                                              "not_applicable": 0}
    assert "PASSED" in out["md"].read_text()
    assert ET.parse(out["xml"]).getroot().find("testsuite").get("failures") == "0"
    assert hal_main(["conformance", "--plugin", "cpu", "--level", "contract", "-k", "profile",
                     "--report", str(out["html"])]) == 0
    assert out["html"].read_text().count("<tr class='passed'>") == 2  # profile, profile_plausible


def test_cli_exit_codes(tmp_path, capsys):
    rc = hal_main(["conformance", "--plugin", "tests.broken_plugins.bad_profile_units", "--level", "contract",
                   "--json", str(tmp_path / "r.json")])
    assert rc == 1
    data = json.loads((tmp_path / "r.json").read_text())
    assert [c["id"] for c in data["checks"] if c["status"] == "failed"] == ["contract.profile_plausible"]
    assert "contract.profile_plausible" in capsys.readouterr().out
    # A chip that is not native here and not --emulate: the suite cannot start (exit 2, says why).
    assert hal_main(["conformance", "--plugin", "cuda", "--level", "contract"]) == 2
    assert "--emulate" in capsys.readouterr().err
    # an unknown plugin is bad input: exit 2 before any check (issue 16; the docstring's documented code)
    assert hal_main(["conformance", "--plugin", "no_such_plugin_xyz", "--level", "contract"]) == 2
    assert hal_main(["conformance", "--plugin", "cpu", "--level", "nope"]) == 2


def test_list_shows_ids_with_what_they_verify(capsys):
    assert hal_main(["conformance", "--plugin", "cuda", "--emulate", "--list", "--level", "runtime,errors"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("runtime.event_wait") and "wait" in line for line in lines)
    assert len(lines) == 13 + 9  # runtime: 3 prerequisites + 10 more; errors: 9


def test_pytest_plugin_runs_checks_as_items(tmp_path):
    """As a vendor's CI runs it: a fresh interpreter, `pytest -p hal.conformance --hal-plugin NAME -k ...`."""
    junit = tmp_path / "j.xml"
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "hal.conformance", "-q", "-p", "no:cacheprovider",
                        "--hal-plugin", "cpu", "--hal-level", "contract", "-k", "registers or plausible",
                        f"--junitxml={junit}", f"--hal-json={tmp_path / 'r.json'}"],
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 passed" in p.stdout and "deselected" in p.stdout
    names = sorted(c.get("name") for c in ET.parse(junit).getroot().iter("testcase"))
    assert names == ["contract.profile_plausible", "contract.registers"]  # only the suite, not tests/
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["passed"] == 2


def test_pytest_plugin_reports_a_failing_check(tmp_path, capsys):
    # In-process (the contract level needs no worker pool): the failing item is the check's id,
    # and its report says what was expected and what came.
    junit = tmp_path / "j.xml"
    rc = pytest.main(["-p", "hal.conformance", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                      "--hal-plugin", "tests.broken_plugins.bad_profile_units", "--hal-level", "contract",
                      f"--junitxml={junit}"])
    out = capsys.readouterr().out
    assert rc == 1, out
    failed = [c.get("name") for c in ET.parse(junit).getroot().iter("testcase") if c.find("failure") is not None]
    assert failed == ["contract.profile_plausible"]
    assert "989 FLOP/s" in out and "outside the physical range [1e+09, 1e+17]" in out


def test_pytest_plugin_is_inert_without_hal_plugin():
    from hal.conformance import pytest_configure

    class Config:
        registered = []
        pluginmanager = type("PM", (), {"register": lambda self, obj, name=None: Config.registered.append(name)})()

        def getoption(self, name, default=None):
            return None

    pytest_configure(Config())
    assert Config.registered == []


class _StubPool:
    """Stands in for a WorkerPool: `behaviour` says what the next run does (the real pool's kill on
    timeout and its death reports are tested in tests/test_worker_pool.py)."""

    def __init__(self, behaviour):
        self.behaviour = behaviour
        proc = type("P", (), {"join": lambda self, t=None: None, "exitcode": -6})()
        self._procs = [proc]

    def alive(self):
        return [True]

    def run(self, fn, *args, **kwargs):
        from hal.testing import Outcome
        if fn.__name__ in ("prepare", "ping"):
            return []
        if self.behaviour == "hang":
            raise TimeoutError("killed")
        if self.behaviour == "abort":
            return [Outcome(0, False, error="worker process died", died=True)]
        return [Outcome(0, True, value={"status": "passed", "message": "fine", "data": None})]

    def close(self, kill=False):
        pass


class _StubHandle(PoolHandle):
    def __init__(self, behaviours):
        super().__init__(1)
        self.behaviours = list(behaviours)

    def get(self, size=None, keep_other=False):
        if self._pool is None:
            self._pools[self.nproc] = _StubPool(self.behaviours.pop(0))
            self.starts += 1
        return self._pool


def test_a_hang_and_an_abort_fail_one_check_each_and_the_pool_is_replaced():
    handle = _StubHandle(["hang", "abort", "ok"])
    runner = Runner(load_target("cpu", nproc=1), pool=handle)
    checks = [Check("errors.hangs", "errors", "", hangs, where="rank0", timeout=3),
              Check("errors.aborts", "errors", "", aborts, where="rank0", timeout=30),
              Check("errors.passes", "errors", "", passes, where="rank0", timeout=30),
              Check("errors.fails_on_rank_1", "errors", "", fails_on_rank_1, where="all", timeout=30)]
    hang, abort, ok, multi = runner.run(checks)
    assert hang.status == "failed" and "did not finish within 3s" in hang.message
    assert abort.status == "failed" and "died of SIGABRT (exit code -6)" in abort.message, abort.message
    assert ok.status == "passed" and ok.message == "fine"
    assert multi.status == "skipped" and "needs >= 2 ranks" in multi.message
    assert handle.starts == 3  # the first pool, one after the hang, one after the abort


def test_a_real_abort_in_a_worker_is_reported_with_its_signal():
    with PoolHandle(1) as pool:
        runner = Runner(load_target("cpu", nproc=1), pool=pool)
        (abort,) = runner.run([Check("errors.aborts", "errors", "", aborts, where="rank0", timeout=60)])
        assert pool._pool is None  # discarded: the next check would start a fresh pool
    assert abort.status == "failed" and "died of SIGABRT (exit code -6)" in abort.message, abort.message


def test_rank_results_are_merged_naming_the_ranks():
    class O:
        def __init__(self, rank, status, message):
            self.rank, self.ok, self.died = rank, True, False
            self.value = {"status": status, "message": message, "data": None}

    runner = Runner(load_target("cpu", nproc=2), pool=PoolHandle(2))  # the pool is never started here
    check = Check("collectives.x", "collectives", "", passes, where="all")
    res = runner._merge(check, [O(0, "passed", "fine"), O(1, "failed", "expected 1, got 2")], 0.1, 2)
    assert res.status == "failed" and res.message == "rank 1: expected 1, got 2"
    res = runner._merge(check, [O(0, "passed", "same"), O(1, "passed", "same")], 0.1, 2)
    assert res.status == "passed" and res.message == "same"


def test_not_applicable_does_not_fail_a_strict_run(tmp_path, capsys):
    """A host-device chip has no second device and no device index to get wrong: those checks are
    not applicable (not skipped), so a --fail-on-skip run still passes (issue 17, item 6)."""
    path = tmp_path / "r.json"
    rc = hal_main(["conformance", "--plugin", "cpu", "--level", "errors", "-k", "op_wrong_device", "-k",
                   "device_index_out_of_range", "--nproc", "2", "--fail-on-skip", "--json", str(path)])
    assert rc == 0, capsys.readouterr().out
    data = json.loads(path.read_text())
    assert [c["status"] for c in data["checks"]] == ["not_applicable", "not_applicable"]
    assert data["summary"]["skipped"] == 0 and data["summary"]["not_applicable"] == 2
