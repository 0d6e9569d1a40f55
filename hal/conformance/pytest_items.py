"""pytest nodes for conformance checks, and the session object that owns the runner (see pytest_plugin)."""
from __future__ import annotations

import time
from typing import Any, Optional

import pytest

from .checks import Check, CheckResult, parse_levels
from .report import Report
from .runner import Runner
from .target import Target, load_target


class CheckFailure(Exception):
    """Raised by a failed check item; pytest shows its message (expected vs got) without a traceback."""


class CheckItem(pytest.Item):
    def __init__(self, *, check: Check, session_obj: "ConformanceSession", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check = check
        self.session_obj = session_obj
        self.add_marker(pytest.mark.hal_conformance)
        self.add_marker(getattr(pytest.mark, f"hal_{check.level}"))

    def runtest(self) -> None:
        res = self.session_obj.run(self.check)
        self.user_properties.append(("hal_status", res.status))
        if res.status == "failed":
            raise CheckFailure(res.message)
        if res.status == "skipped":
            pytest.skip(res.message)
        if res.status == "not_applicable":
            pytest.skip(f"not applicable: {res.message}")

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        if isinstance(excinfo.value, CheckFailure):
            return f"{self.check.id} ({self.check.doc}):\n{excinfo.value}"
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Any, Optional[int], str]:
        return self.path, None, f"hal conformance {self.check.id}"


class SuiteCollector(pytest.Collector):
    def __init__(self, *, checks: list[Check], session_obj: "ConformanceSession", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.checks = checks
        self.session_obj = session_obj

    def collect(self) -> list[CheckItem]:
        return [CheckItem.from_parent(self, name=c.id, check=c, session_obj=self.session_obj) for c in self.checks]


class ConformanceSession:
    """Registered as a pytest plugin when --hal-plugin is given; collects and runs the checks."""

    def __init__(self, config: Any) -> None:
        self.config = config
        opt = config.getoption
        try:
            self.levels = parse_levels(opt("hal_level"))
            self.target: Target = load_target(opt("hal_plugin"), chip=opt("hal_chip"), emulate=opt("hal_emulate"),
                                              nproc=opt("hal_nproc") or 2, group_timeout_s=opt("hal_timeout"))
            if opt("hal_nproc") is None:
                from .target import default_nproc
                self.target.nproc = default_nproc(self.target)
        except Exception as exc:
            raise pytest.UsageError(f"hal conformance: {type(exc).__name__}: {exc}") from exc
        self.runner: Optional[Runner] = None
        self.results: list[CheckResult] = []
        self.t0 = time.perf_counter()
        # Only the suite unless test paths were named on the command line.
        self.suite_only = not config.args or getattr(config, "args_source", None) != pytest.Config.ArgsSource.ARGS

    def pytest_ignore_collect(self, collection_path: Any, config: Any) -> Optional[bool]:
        return True if self.suite_only else None

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: Any, config: Any, items: list) -> None:
        from .suite import discover
        checks = discover(self.target, self.levels)
        name = f"hal-conformance[{self.target.plugin_name}:{self.target.chip}" \
               f"{':emulated' if self.target.emulated else ''}]"
        collector = SuiteCollector.from_parent(session, name=name, nodeid=name, checks=checks, session_obj=self)
        items.extend(collector.collect())

    def run(self, check: Check) -> CheckResult:
        if self.runner is None:
            self.runner = Runner(self.target)
        res = self.runner.run_one(check)
        self.results.append(res)
        return res

    def pytest_sessionfinish(self, session: Any) -> None:
        if self.runner is not None:
            self.runner.close()
        opt = self.config.getoption
        if self.results and (opt("hal_json") or opt("hal_report")):
            report = Report.build(self.target, self.levels, self.results, time.perf_counter() - self.t0)
            if opt("hal_json"):
                report.write_json(opt("hal_json"))
            if opt("hal_report"):
                report.write_human(opt("hal_report"))

    def pytest_report_header(self, config: Any) -> str:
        t = self.target
        return (f"hal conformance: plugin {t.plugin_name}, chip {t.chip} ({'EMULATED' if t.emulated else 'native'}), "
                f"levels {','.join(self.levels)}, {t.nproc} ranks")
