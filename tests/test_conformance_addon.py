"""`hal conformance --plugin ADDON --chip CHIP` certifies an add-on (a plugin that declares no chip):
the chip's owner is loaded with it, every op case and refusal rule runs on the add-on's own kernels
and on what the chip dispatches, and contract.addon_effect checks what the add-on changes (its
kernels dispatched, a wrapper's rewrite of the owner's kernels). One 2-rank pool for the module."""
import importlib
import os
import sys

import pytest

from hal.conformance.runner import PoolHandle
from hal.conformance.suite import run_suite
from hal.conformance.target import load_target
from hal.contract.errors import UnknownChipError
from hal.contract.kernel import OP_NAMES


@pytest.fixture(scope="module")
def template_addon(tmp_path_factory):
    """The add-on `hal new-plugin fastnorm --addon cpu` writes, importable here and in the pool."""
    from hal.cli.new_plugin import render
    root = tmp_path_factory.mktemp("addon")
    render("fastnorm", root, addon="cpu")
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(root)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    importlib.invalidate_caches()
    yield "hal_fastnorm"
    sys.path.remove(str(root))


@pytest.fixture(scope="module")
def pool(template_addon):
    with PoolHandle(2) as handle:
        yield handle


def _status(report):
    return {r.id: r for r in report.results}


def test_template_addon_is_certified_on_every_ops_case(template_addon, pool):
    target = load_target(template_addon, chip="cpu")
    assert target.is_addon and target.owner == "hal_cpu" and target.plugins == ("hal_cpu", "hal_fastnorm")
    report = run_suite(target, ["contract", "ops"], None, pool=pool)
    status = _status(report)
    assert report.ok, report.console()
    # every op of the contract at every dtype, as dispatched, plus the add-on's own kernel directly
    assert {f"ops.{op}.float32" for op in OP_NAMES} <= set(status)
    addon = sorted(i for i in status if i.startswith("ops.addon."))
    assert addon == ["ops.addon.refusals.rms_norm"] + [f"ops.addon.rms_norm.{d}" for d in
                                                       ("bfloat16", "float16", "float32", "float64")]
    assert "fastnorm.rms_norm" in status["ops.rms_norm.float32"].message  # the chip dispatches the add-on's
    assert "dispatches to the add-on's fastnorm.rms_norm" in status["contract.addon_effect"].message


def test_a_wrapper_addon_effect_is_seen_and_checked(pool):
    target = load_target("tests.addons.wrap_kernels", chip="cpu")
    report = run_suite(target, ["contract", "ops"], ["contract.addon_effect", "ops.silu.float32", "ops.gelu.float32"],
                       pool=pool)
    status = _status(report)
    assert status["contract.addon_effect"].status == "passed", status["contract.addon_effect"].message
    assert "wrapper of hal_op_kernels changes the owner's kernels" in status["contract.addon_effect"].message
    assert status["ops.silu.float32"].status == "failed"          # the wrapper's wrong silu is what runs
    assert "counted[" in status["ops.silu.float32"].message
    assert status["ops.gelu.float32"].status == "passed"


def test_a_shadowed_addon_kernel_fails_the_effect_check():
    target = load_target("tests.addons.shadowed", chip="cpu")
    report = run_suite(target, ["contract"], ["contract.addon_effect"])
    msg = _status(report)["contract.addon_effect"].message
    assert not report.ok and "never dispatched" in msg and "shadowed.silu" in msg, msg


def test_an_addon_needs_an_installed_chip(template_addon):
    with pytest.raises(UnknownChipError, match="declares no chip .* --chip .*installed chips: .*cpu"):
        load_target(template_addon)
    with pytest.raises(UnknownChipError, match="--chip 'nope': no installed plugin declares it"):
        load_target(template_addon, chip="nope")
