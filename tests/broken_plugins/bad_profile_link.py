"""Broken plugin: the profile's intra-node bandwidth is another link's figure (a 1 GbE management port).

1e8 B/s (the usable rate of 1 GbE) is inside the physical range of a link (contract.profile_plausible passes), but the ranks
on one node of this chip exchange data far faster: the perf level's collective bus bandwidth is many
times the declared link, which no chip does (in-switch reduction reaches about 1.1x). A planner
trusting the figure would never put tensor parallelism inside a node.
"""
import hal

from ._base import cpu_profile_for, install

BUG = "declared intra-node bandwidth (1e8 B/s, a 1 GbE port) is far below the measured collective busbw"
CAUGHT_BY = "perf.profile_agreement"
LEVELS = ["contract", "perf"]
SELECT = ["contract.profile_plausible", "perf.collective_busbw", "perf.profile_agreement"]
STILL_PASSES = ["contract.profile_plausible", "perf.collective_busbw"]
MESSAGE = ["intra_node_bandwidth", "declared"]
TIMEOUT = 120


def profile():
    fig = hal.Figure(value=1e8, unit="B/s", source="BMC datasheet: 1 GbE management port")
    return cpu_profile_for("bad_profile_link", intra_node_bandwidth=fig)


install(globals(), "bad_profile_link", BUG, profile=profile)
