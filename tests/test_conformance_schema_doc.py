"""docs/conformance.md's JSON report schema is the one hal/conformance/report.py writes: every key (at
the top, in a check, in the summary and its root cause), every status and the schema version, in
both directions."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from hal.conformance.checks import LEVELS, PREREQUISITES, STATUSES, CheckResult, not_run_because
from hal.conformance.report import SCHEMA_VERSION, Report

DOC = Path(__file__).resolve().parents[1] / "docs" / "conformance.md"


def _schema_block() -> str:
    text = DOC.read_text()
    start, end = text.index("<!-- report-schema: begin -->"), text.index("<!-- report-schema: end -->")
    return text[start:end]


def _emitted() -> dict:
    target = SimpleNamespace(plugin_name="acme", chip="acme", emulated=True, plugin_version="0.1.0")
    results = [CheckResult(f"contract.c{i}", "contract", status, "m", 0.1) for i, status in enumerate(STATUSES)]
    # a failed prerequisite and a check not run for it: the summary's optional root_cause (schema 1.2)
    results += [CheckResult(PREREQUISITES[0], "runtime", "failed", "m", 0.1)]
    results += [CheckResult("collectives.c", "collectives", "skipped", not_run_because(results[-1]), 0.0)]
    return Report.build(target, list(LEVELS), results, 1.0).as_json()


def test_the_documented_schema_lists_every_key_and_status_the_report_emits():
    block = _schema_block()
    data = _emitted()
    keys = re.findall(r'"(\w+)"\s*:', block)
    quoted = set(re.findall(r'"(\w+)"', block))
    emitted_keys = list(data) + list(data["checks"][0]) + list(data["summary"]) + list(data["summary"]["root_cause"])
    assert sorted(set(keys)) == sorted(set(emitted_keys)), (sorted(set(keys)), sorted(set(emitted_keys)))
    assert [k for k in keys if k in data][:len(data)] == list(data)  # top-level keys in the report's order
    statuses = {r["status"] for r in data["checks"]}
    assert statuses == set(STATUSES) and statuses <= quoted and set(data["summary"]) == {"root_cause", *STATUSES}
    assert list(data["summary"])[0] == "root_cause" and data["summary"]["root_cause"]["not_run"] == 1
    assert f'"schema_version": "{SCHEMA_VERSION}"' in block
    assert set(LEVELS) <= quoted  # every level a report may list
    documented_statuses = set(re.search(r'"status":([^,]+),', block).group(1).replace('"', " ").split()) - {"|"}
    assert documented_statuses == set(STATUSES)
