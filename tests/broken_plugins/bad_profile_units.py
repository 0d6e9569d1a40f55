"""Broken plugin: the profile gives peak FLOP/s in TFLOP/s (989 instead of 9.89e14) under the unit
"FLOP/s"; it validates (a number with a unit and a source) but a planner would think the chip is a
trillion times slower than it is."""
import hal

from ._base import cpu_profile_for, install

BUG = "profile peak written in TFLOP/s under the unit FLOP/s"
CAUGHT_BY = "contract.profile_plausible"
LEVELS = ["contract"]
SELECT = None
STILL_PASSES = ["contract.profile", "contract.registers"]


def profile():
    fig = hal.Figure(value=989.0, unit="FLOP/s", source="vendor datasheet, table 1 (TFLOP/s)")
    return cpu_profile_for("bad_profile_units", peak_flops={"bfloat16": fig})


install(globals(), "bad_profile_units", BUG, profile=profile)
