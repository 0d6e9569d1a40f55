"""Broken plugin: the profile declares a peak the chip cannot come near (another chip's figure).

1 PFLOP/s of float32 for a host CPU: the figure is in the plausible range of a FLOP/s number and has
a source, so the contract level accepts it; the perf level measures the chip at a tiny fraction of
it. A planner using the declared figure would give this chip thousands of times its share.
"""
import hal

from ._base import cpu_profile_for, install

BUG = "declared float32 peak (1e15 FLOP/s) is far from what the chip measures"
CAUGHT_BY = "perf.profile_agreement"
LEVELS = ["contract", "perf"]
SELECT = ["contract.profile_plausible", "perf.matmul", "perf.memory_bandwidth", "perf.profile_agreement"]
STILL_PASSES = ["contract.profile_plausible", "perf.matmul"]
MESSAGE = ["float32", "declared"]


def profile():
    fig = hal.Figure(value=1e15, unit="FLOP/s", source="copied from another chip's datasheet")
    return cpu_profile_for("bad_profile_peak", peak_flops={"float32": fig})


install(globals(), "bad_profile_peak", BUG, profile=profile)
