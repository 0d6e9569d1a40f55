"""Every deliberately broken plugin (tests/broken_plugins) is caught by the check meant to catch it.

Each plugin declares its bug, the check id that must fail (CAUGHT_BY), the smallest run that
reaches it (LEVELS, SELECT, and NPROC where the bug needs more than 2 ranks, e.g. an odd world
size), words the failure message must contain (MESSAGE), and checks that must still pass
(STILL_PASSES: the bug is specific, the suite does not just fail everything). One pool handle
serves every plugin (the workers rebind per plugin), so process start-up is paid once per size.
Plugins that hang or die (HANGS) are run by tests/test_conformance_bounds.py with short bounds.
"""
import importlib
import pkgutil

import pytest

import tests.broken_plugins as broken_pkg
from hal.conformance.runner import PoolHandle
from hal.conformance.suite import run_suite
from hal.conformance.target import load_target

ALL = sorted(m.name for m in pkgutil.iter_modules(broken_pkg.__path__) if m.name.startswith("bad_"))
BROKEN = [n for n in ALL if not getattr(importlib.import_module(f"tests.broken_plugins.{n}"), "HANGS", False)]


def _pool_order(name: str) -> tuple[int, bool]:
    """The 2-rank plugins first, the one whose run ends on the bridge's 3 ranks next, the 4-rank ones
    last: each pool size is started once in the parametrized cases (ops-only runs use the warm pool)."""
    module = importlib.import_module(f"tests.broken_plugins.{name}")
    return getattr(module, "NPROC", 2), "bridge" in module.LEVELS


BROKEN.sort(key=_pool_order)


@pytest.fixture(scope="module")
def pool():
    with PoolHandle(2) as handle:
        yield handle


def test_there_are_broken_plugins_for_every_required_bug():
    required = {"bad_reduce_dtype", "bad_alltoall_uneven", "bad_broadcast_root", "bad_event_wait",
                "bad_capability_lies", "bad_rng_seed", "bad_noncontig_op", "bad_async_early",
                # issue 14's properties, one plugin each
                "bad_hang_collective", "bad_hang_runtime", "bad_hang_probe", "bad_abort_collective",
                "bad_power_of_two", "bad_middle_root", "bad_storage_offset", "bad_strided_broadcast",
                "bad_int_saturate", "bad_bf16_via_fp16", "bad_inplace_op", "bad_output_layout",
                "bad_softmax_overflow", "bad_memory_never_freed", "bad_timing_units", "bad_profile_peak",
                "bad_untyped_refusal", "bad_thin_matrix"}
    assert required <= set(ALL), f"missing broken plugins: {required - set(ALL)}"


def run_broken(name, pool, **kwargs):
    """Run broken plugin `name` as its module says and check it is caught as it says; the report."""
    module = importlib.import_module(f"tests.broken_plugins.{name}")
    nproc = getattr(module, "NPROC", 2)
    timeout = kwargs.pop("timeout", getattr(module, "TIMEOUT", 20))
    target = load_target(f"tests.broken_plugins.{name}", nproc=nproc, group_timeout_s=timeout)
    assert target.load_error is None, target.load_error
    assert target.chip == name and not target.emulated  # native: the plugin's own hooks are exercised
    report = run_suite(target, module.LEVELS, module.SELECT, pool=pool, **kwargs)
    status = {r.id: r for r in report.results}
    assert module.CAUGHT_BY in status, f"{module.CAUGHT_BY} did not run; ran {sorted(status)}"
    caught = status[module.CAUGHT_BY]
    assert caught.status == "failed", f"{name} ({module.BUG}) was not caught by {module.CAUGHT_BY}:\n{report.console()}"
    assert caught.message, "a failure must say what was expected and what came"
    for word in getattr(module, "MESSAGE", []):
        assert word in caught.message, f"{module.CAUGHT_BY}'s message lacks {word!r}: {caught.message}"
    for cid in getattr(module, "ALSO_FAILS", []):
        assert status[cid].status == "failed", f"{cid} should fail too: {status[cid].message}"
    for cid in module.STILL_PASSES:
        assert status[cid].status == "passed", f"{cid} should pass despite the bug: {status[cid].message}"
    assert not report.ok
    return report


def test_failure_messages_say_expected_and_got(pool):
    target = load_target("tests.broken_plugins.bad_broadcast_root", nproc=2, group_timeout_s=20)
    report = run_suite(target, ["collectives"], ["collectives.broadcast.int32"], pool=pool)
    (res,) = report.results
    assert res.status == "failed"
    assert "root=1" in res.message and "expected" in res.message and "got" in res.message, res.message


@pytest.mark.parametrize("name", BROKEN)
def test_broken_plugin_is_caught(name, pool):
    run_broken(name, pool)


def test_bridge_level_reaches_the_plugins_own_ccl_by_default(pool):
    """Issue 17, item 8: with the default ranks the bridge group holds 2 ranks of the plugin's chip,
    so a bug in its own CCL (bad_bf16_via_fp16: bfloat16 sums through float16, in every reducing
    collective) fails the bridge level too; with one rank per chip the bridge never called that CCL."""
    target = load_target("tests.broken_plugins.bad_bf16_via_fp16", nproc=2, group_timeout_s=20)
    report = run_suite(target, ["bridge"], ["bridge.all_reduce.bfloat16.sum", "bridge.all_reduce.float32.sum"],
                       pool=pool)
    res = {r.id: r for r in report.results}
    assert res["bridge.all_reduce.bfloat16.sum"].status == "failed", res["bridge.all_reduce.bfloat16.sum"].message
    assert res["bridge.all_reduce.float32.sum"].status == "passed", res["bridge.all_reduce.float32.sum"].message
    assert "2 on bad_bf16_via_fp16" in res["bridge.all_reduce.float32.sum"].message
