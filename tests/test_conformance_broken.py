"""Every deliberately broken plugin (tests/broken_plugins) is caught by the check meant to catch it.

Each plugin declares its bug, the check id that must fail (CAUGHT_BY), the smallest run that
reaches it (LEVELS, SELECT), and checks that must still pass (STILL_PASSES: the bug is specific,
the suite does not just fail everything). One worker pool serves every plugin (the workers rebind
per plugin), so process start-up is paid once for the module.
"""
import importlib
import pkgutil

import pytest

import tests.broken_plugins as broken_pkg
from conformance.runner import PoolHandle
from conformance.suite import run_suite
from conformance.target import load_target

BROKEN = sorted(m.name for m in pkgutil.iter_modules(broken_pkg.__path__) if m.name.startswith("bad_"))


@pytest.fixture(scope="module")
def pool():
    with PoolHandle(2) as handle:
        yield handle


def test_there_are_broken_plugins_for_every_required_bug():
    required = {"bad_reduce_dtype", "bad_alltoall_uneven", "bad_broadcast_root", "bad_event_wait",
                "bad_capability_lies", "bad_rng_seed", "bad_noncontig_op", "bad_async_early"}
    assert required <= set(BROKEN), f"missing broken plugins: {required - set(BROKEN)}"


@pytest.mark.parametrize("name", BROKEN)
def test_broken_plugin_is_caught(name, pool):
    module = importlib.import_module(f"tests.broken_plugins.{name}")
    target = load_target(f"tests.broken_plugins.{name}", nproc=2, group_timeout_s=20)
    assert target.load_error is None, target.load_error
    assert target.chip == name and not target.emulated  # native: the plugin's own hooks are exercised
    report = run_suite(target, module.LEVELS, module.SELECT, pool=pool)
    status = {r.id: r for r in report.results}
    assert module.CAUGHT_BY in status, f"{module.CAUGHT_BY} did not run; ran {sorted(status)}"
    caught = status[module.CAUGHT_BY]
    assert caught.status == "failed", f"{name} ({module.BUG}) was not caught by {module.CAUGHT_BY}:\n{report.console()}"
    assert caught.message, "a failure must say what was expected and what came"
    for cid in getattr(module, "ALSO_FAILS", []):
        assert status[cid].status == "failed", f"{cid} should fail too: {status[cid].message}"
    for cid in module.STILL_PASSES:
        assert status[cid].status == "passed", f"{cid} should pass despite the bug: {status[cid].message}"
    assert not report.ok


def test_failure_messages_say_expected_and_got(pool):
    target = load_target("tests.broken_plugins.bad_broadcast_root", nproc=2, group_timeout_s=20)
    report = run_suite(target, ["collectives"], ["collectives.broadcast.int32"], pool=pool)
    (res,) = report.results
    assert res.status == "failed"
    assert "root=1" in res.message and "expected" in res.message and "got" in res.message, res.message
