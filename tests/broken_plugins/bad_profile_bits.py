"""Broken plugin: the profile gives the NIC bandwidth in bits/s under the unit "B/s".

A 400 Gb/s NIC per device written as 400e9 B/s: 8x too fast, and past the fastest network any device
ships with (one 800 Gb/s NIC = 1e11 B/s). It validates (a number, a unit, a source) and the old
per-unit range (B/s up to 1e14) let it through; a planner would then price inter-node traffic at an
eighth of its cost and put tensor parallelism across nodes.
"""
import hal

from ._base import cpu_profile_for, install

BUG = "NIC bandwidth written in bits/s under the unit B/s (400 Gb/s NIC as 400e9 B/s)"
CAUGHT_BY = "contract.profile_plausible"
LEVELS = ["contract"]
SELECT = None
STILL_PASSES = ["contract.profile", "contract.registers"]
MESSAGE = ["nic_bandwidth", "bits/s"]


def profile():
    fig = hal.Figure(value=400e9, unit="B/s", source="vendor datasheet: ConnectX-7, 400 Gb/s per port")
    return cpu_profile_for("bad_profile_bits", nic_bandwidth=fig)


install(globals(), "bad_profile_bits", BUG, profile=profile)
