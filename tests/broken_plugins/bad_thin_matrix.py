"""Broken plugin: a CCL that declares (and does) only SUM all_reduce of float32 and bfloat16.

Every declared entry is right and everything else is refused with hal.NotSupportedError, as the
hookspec asks, so the collectives level passes. But the bridge cannot build expert parallel's
all_to_all_single from it (no send/recv, no all_gather to carry bytes) and refuses it: training
with experts on this chip fails. The bridge level used to count that refusal as a pass.
"""
import hal

from ._base import install

BUG = "capability matrix too thin for the bridge to serve what training issues (all_to_all_single)"
CAUGHT_BY = "bridge.all_to_all_single.float32"
LEVELS = ["collectives", "bridge"]
SELECT = ["collectives.all_reduce.float32.sum", "bridge.all_to_all_single.float32"]
STILL_PASSES = ["collectives.all_reduce.float32.sum"]
MESSAGE = ["required", "expert-parallel"]
TIMEOUT = 5  # the cpu rank waits for chip ranks that refused: short group timeout

CAPS = hal.CapabilityMatrix.build("bad_thin_matrix", source="declared: only what the vendor kernel does",
                                  collectives=("all_reduce", "barrier"), dtypes=("float32", "bfloat16"),
                                  reduce_ops=("sum",))

install(globals(), "bad_thin_matrix", BUG, capabilities=CAPS)
