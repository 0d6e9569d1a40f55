"""The suite's reports: JSON (machine-readable, versioned), Markdown or HTML (for people), JUnit XML (for CI).

JSON, exactly:
    {"schema_version", "plugin", "chip", "emulated", "levels",
     "checks": [{"id", "level", "status": "passed|failed|skipped|not_applicable", "message", "duration_s"}],
     "summary": {["root_cause": {"id", "message", "not_run"},] "passed", "failed", "skipped", "not_applicable"},
     "efficiency_matrix": {...} or null}
(schema 1.1 added `not_applicable`: a property this plugin does not have as declared; it never
counts against the verdict, while `skipped` means "applies, not verified here". Schema 1.2 added
`summary.root_cause`, first in the summary and only when a prerequisite failed: the console,
Markdown and HTML summaries then start with the same "ROOT CAUSE: <id> failed: <message>" line.)
The human report starts with a per-level summary table, then lists the failures first, then the
skipped checks with their reasons, then every passed check. An emulated chip is labelled EMULATED
at the top of every format.
"""
from __future__ import annotations

import html
import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .checks import LEVELS, NOT_RUN_PREREQUISITE, PREREQUISITES, STATUSES, CheckResult

SCHEMA_VERSION = "1.2"
# What everything else stands on, in order: the first of these that failed is the run's root cause.
ROOT_CAUSES: tuple[str, ...] = ("contract.registers",) + PREREQUISITES


@dataclass
class Report:
    plugin: str
    chip: str
    emulated: bool
    levels: list[str]
    results: list[CheckResult]
    seconds: float = 0.0
    efficiency_matrix: Any = None  # hal.core.efficiency.EfficiencyMatrix when perf ran
    plugin_version: Optional[str] = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def build(cls, target, levels: list[str], results: list[CheckResult], seconds: float = 0.0) -> "Report":
        matrix = next((r.data for r in results if r.id == "perf.efficiency_matrix" and r.status == "passed"), None)
        return cls(plugin=target.plugin_name, chip=target.chip, emulated=target.emulated, levels=levels,
                   results=results, seconds=seconds, efficiency_matrix=matrix,
                   plugin_version=target.plugin_version)

    # ---- figures ------------------------------------------------------------------------------
    @property
    def summary(self) -> dict[str, int]:
        out = {s: 0 for s in STATUSES}
        for r in self.results:
            out[r.status] += 1
        return out

    @property
    def root_cause(self) -> Optional[dict[str, Any]]:
        """The first failed prerequisite (`ROOT_CAUSES`: the plugin loads, the device count, each rank's
        device, the process group) with how many checks were not run for it; None when none failed."""
        failed = {r.id: r for r in self.results if r.status == "failed" and r.id in ROOT_CAUSES}
        first = next((failed[i] for i in ROOT_CAUSES if i in failed), None)
        if first is None:
            return None
        not_run = sum(1 for r in self.results if r.status == "skipped"
                      and (r.message.startswith(NOT_RUN_PREREQUISITE) or "the plugin did not load" in r.message))
        return {"id": first.id, "message": first.message, "not_run": not_run}

    def root_cause_line(self) -> Optional[str]:
        """'ROOT CAUSE: <id> failed: <message> (N check(s) that depend on it not run)', or None."""
        rc = self.root_cause
        if rc is None:
            return None
        return (f"ROOT CAUSE: {rc['id']} failed: {' '.join(rc['message'].split())} ({rc['not_run']} check(s) that "
                f"depend on it not run)")

    @property
    def ok(self) -> bool:
        """True when no selected check failed (skipped checks are listed with their reasons)."""
        return self.summary["failed"] == 0

    def by_level(self) -> dict[str, dict[str, float]]:
        table: dict[str, dict[str, float]] = {}
        for r in self.results:
            row = table.setdefault(r.level, {**{s: 0 for s in STATUSES}, "seconds": 0.0})
            row[r.status] += 1
            row["seconds"] += r.duration_s
        return {lvl: table[lvl] for lvl in LEVELS if lvl in table}

    @property
    def label(self) -> str:
        return f"{self.chip} ({'EMULATED' if self.emulated else 'native'})"

    # ---- JSON ---------------------------------------------------------------------------------
    def as_json(self) -> dict:
        em = self.efficiency_matrix
        return {"schema_version": SCHEMA_VERSION, "plugin": self.plugin, "chip": self.chip, "emulated": self.emulated,
                "levels": list(self.levels), "checks": [r.as_json() for r in self.results],
                "summary": ({"root_cause": rc} if (rc := self.root_cause) else {}) | self.summary,
                "efficiency_matrix": em.model_dump(mode="json") if em is not None else None}

    def write_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.as_json(), indent=2) + "\n")

    # ---- Markdown / HTML ----------------------------------------------------------------------
    def reasons(self, status: str) -> list[tuple[str, int, str]]:
        """(message, how many checks, the first check's id) of every distinct reason for `status`
        (skipped / not_applicable), most frequent first: why checks were not verified, grouped."""
        groups: dict[str, list[str]] = {}
        for r in self.results:
            if r.status == status:
                groups.setdefault(" ".join(r.message.split()), []).append(r.id)
        return sorted(((m, len(ids), ids[0]) for m, ids in groups.items()), key=lambda g: -g[1])

    def _ordered(self) -> list[CheckResult]:
        rank = {"failed": 0, "skipped": 1, "not_applicable": 2, "passed": 3}
        return sorted(self.results, key=lambda r: rank[r.status])  # stable: level order within a status

    def markdown(self) -> str:
        s = self.summary
        verdict = "PASSED" if self.ok else "FAILED"
        root = self.root_cause_line()
        lines = [f"**{root.replace('|', '/')}**", ""] if root else []
        lines += [f"# Conformance: plugin `{self.plugin}` {self.plugin_version or ''}, chip `{self.label}`", "",
                 f"**{verdict}**: {s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped, "
                 f"{s['not_applicable']} not applicable in {self.seconds:.1f} s; levels: {', '.join(self.levels)}.", ""]
        if self.emulated:
            lines += ["> EMULATED: this chip ran on the host CPU with a CPU stand-in for its CCL; the results say "
                      "whether the plugin's logic is right, not how its hardware behaves.", ""]
        lines += ["| level | passed | failed | skipped | not applicable | seconds |", "|---|---:|---:|---:|---:|---:|"]
        for lvl, row in self.by_level().items():
            lines.append(f"| {lvl} | {row['passed']} | {row['failed']} | {row['skipped']} | {row['not_applicable']} "
                         f"| {row['seconds']:.1f} |")
        lines.append("")
        for status, title in (("failed", "Failures"), ("skipped", "Skipped"), ("not_applicable", "Not applicable"),
                              ("passed", "Passed")):
            rows = [r for r in self._ordered() if r.status == status]
            if not rows:
                continue
            lines += [f"## {title} ({len(rows)})", "", "| check | seconds | message |", "|---|---:|---|"]
            for r in rows:
                msg = r.message.replace("|", "\\|").replace("\n", " ")
                lines.append(f"| `{r.id}` | {r.duration_s:.2f} | {msg} |")
            lines.append("")
        if self.efficiency_matrix is not None:
            lines += _matrix_markdown(self.efficiency_matrix)
        return "\n".join(lines) + "\n"

    def html(self) -> str:
        s = self.summary
        esc = html.escape
        out = [f"<!doctype html><html><head><meta charset='utf-8'><title>Conformance {esc(self.plugin)}</title>",
               "<style>body{font-family:sans-serif}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
               "padding:2px 6px;vertical-align:top}.failed{background:#fdd}.skipped{background:#ffd}"
               ".passed{background:#dfd}.not_applicable{background:#eee}</style></head><body>",
               f"<h1>Conformance: plugin {esc(self.plugin)} {esc(self.plugin_version or '')}, "
               f"chip {esc(self.label)}</h1>",
               f"<p><b>{'PASSED' if self.ok else 'FAILED'}</b>: {s['passed']} passed, {s['failed']} failed, "
               f"{s['skipped']} skipped, {s['not_applicable']} not applicable in {self.seconds:.1f} s</p>"]
        root = self.root_cause_line()
        if root:
            out.insert(2, f"<p class='failed'><b>{esc(root)}</b></p>")
        if self.emulated:
            out.append("<p><b>EMULATED</b>: run on the host CPU with a CPU stand-in for the chip's CCL.</p>")
        out.append("<table><tr><th>level</th><th>passed</th><th>failed</th><th>skipped</th><th>seconds</th></tr>")
        for lvl, row in self.by_level().items():
            out.append(f"<tr><td>{lvl}</td><td>{row['passed']}</td><td>{row['failed']}</td><td>{row['skipped']}</td>"
                       f"<td>{row['seconds']:.1f}</td></tr>")
        out.append("</table><h2>Checks (failures first)</h2><table><tr><th>check</th><th>status</th>"
                   "<th>seconds</th><th>message</th></tr>")
        for r in self._ordered():
            out.append(f"<tr class='{r.status}'><td><code>{esc(r.id)}</code></td><td>{r.status}</td>"
                       f"<td>{r.duration_s:.2f}</td><td>{esc(r.message)}</td></tr>")
        out.append("</table>")
        if self.efficiency_matrix is not None:
            out.append("<h2>Efficiency matrix</h2><pre>" + esc(self.efficiency_matrix.model_dump_json(indent=2))
                       + "</pre>")
        out.append("</body></html>")
        return "\n".join(out) + "\n"

    def write_human(self, path: str | Path) -> None:
        p = Path(path)
        text = self.html() if p.suffix.lower() in (".html", ".htm") else self.markdown()
        p.write_text(text)

    # ---- JUnit XML ----------------------------------------------------------------------------
    def junit_xml(self) -> str:
        s = self.summary
        name = f"hal-conformance.{self.plugin}.{self.chip}{'.emulated' if self.emulated else ''}"
        suite = ET.Element("testsuite", name=name, tests=str(len(self.results)), failures=str(s["failed"]),
                           errors="0", skipped=str(s["skipped"] + s["not_applicable"]), time=f"{self.seconds:.3f}")
        for r in self.results:
            case = ET.SubElement(suite, "testcase", classname=f"{name}.{r.level}", name=r.id,
                                 time=f"{r.duration_s:.3f}")
            if r.status == "failed":
                ET.SubElement(case, "failure", message=r.message[:500]).text = r.message
            elif r.status == "skipped":
                ET.SubElement(case, "skipped", message=r.message[:500])
            elif r.status == "not_applicable":
                ET.SubElement(case, "skipped", type="not_applicable", message=f"not applicable: {r.message}"[:500])
        root = ET.Element("testsuites")
        root.append(suite)
        return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"

    def write_junit(self, path: str | Path) -> None:
        Path(path).write_text(self.junit_xml())

    # ---- console ------------------------------------------------------------------------------
    def console(self, verbose: bool = False) -> str:
        s = self.summary
        root = self.root_cause_line()
        lines = [root] if root else []
        lines.append(f"hal conformance: plugin {self.plugin}, chip {self.label}, levels {','.join(self.levels)}")
        for lvl, row in self.by_level().items():
            lines.append(f"  {lvl:<12} {row['passed']:>5} passed {row['failed']:>4} failed {row['skipped']:>4} skipped"
                         f" {row['not_applicable']:>3} n/a  {row['seconds']:6.1f} s")
        for r in self._ordered():
            if r.status == "failed" or (verbose and r.status in ("skipped", "not_applicable")):
                lines.append(f"  {r.status.upper():<7} {r.id}: {r.message}")
        for status, word in (("skipped", "skipped"), ("not_applicable", "not applicable")):
            groups = self.reasons(status) if not verbose else []
            if groups:
                lines.append(f"  {word}: {sum(n for _, n, _ in groups)} check(s), by reason:")
                for msg, n, first in groups[:6]:
                    lines.append(f"    {n:>4} x {msg[:160]} (e.g. {first})")
                if len(groups) > 6:
                    lines.append(f"    ... and {len(groups) - 6} more reason(s) ({sum(n for _, n, _ in groups[6:])} "
                                 f"check(s)); -v or --report lists every check")
        if self.efficiency_matrix is not None:
            em = self.efficiency_matrix
            best = {d: em.best_matmul_flops(d) for d in ("float32", "bfloat16", "float16")}
            figs = ", ".join(f"{d} {v / 1e9:.3g} GFLOP/s" for d, v in best.items() if v)
            lines.append(f"  efficiency matrix: matmul {figs}; memory {(em.memory_bytes_per_s() or 0) / 1e9:.3g} GB/s"
                         + (" (EMULATED: host figures)" if em.emulated else ""))
        lines.append(f"{'PASSED' if self.ok else 'FAILED'}: {s['passed']} passed, {s['failed']} failed, "
                     f"{s['skipped']} skipped, {s['not_applicable']} not applicable in {self.seconds:.1f} s")
        return "\n".join(lines)


def _matrix_markdown(em) -> list[str]:
    lines = ["## Efficiency matrix" + (" (EMULATED: host figures)" if em.emulated else ""), "",
             f"schema {em.schema_version}, device {em.device}, CCL {em.ccl}, measured {em.measured_at} "
             f"on {em.host}", "",
             "| matmul dtype | m=n=k | GFLOP/s | of peak |", "|---|---:|---:|---:|"]
    for f in em.matmul:
        frac = f"{f.fraction_of_peak:.1%}" if f.fraction_of_peak is not None else "-"
        lines.append(f"| {f.dtype} | {f.m} | {f.flops_per_s / 1e9:.3g} | {frac} |")
    for f in em.memory_bandwidth:
        lines.append(f"\nmemory bandwidth ({f.kind}, {f.bytes >> 20} MiB): {f.bytes_per_s / 1e9:.3g} GB/s\n")
    if em.collectives:
        lines += ["| collective | bytes | algbw GB/s | busbw GB/s |", "|---|---:|---:|---:|"]
        for f in em.collectives:
            lines.append(f"| {f.collective} | {f.bytes} | {f.algbw / 1e9:.3g} | {f.busbw / 1e9:.3g} |")
    return lines + [""]
