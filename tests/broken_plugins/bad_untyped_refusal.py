"""Broken plugin: undeclared combinations are refused with whatever the CCL raises (RuntimeError).

The hookspec asks for `hal.NotSupportedError`, which is what the bridge and training code catch to
fall back; a bare RuntimeError looks like a crash. Here the plugin hands every call to raw gloo.
"""
from ._base import install

BUG = "undeclared combinations raise RuntimeError, not hal.NotSupportedError"
CAUGHT_BY = "collectives.all_reduce.float8_e4m3fn.sum"
LEVELS = ["collectives"]
SELECT = ["collectives.all_reduce.float8_e4m3fn.sum", "collectives.all_gather.float32"]
STILL_PASSES = ["collectives.all_gather.float32"]  # raw gloo all_gather handles strided views
MESSAGE = ["NotSupportedError", "RuntimeError"]

# raw gloo: neither the HAL's staging wrapper (which types gloo's refusals) nor a capability guard
install(globals(), "bad_untyped_refusal", BUG, typed_refusals=False, wrap_group=lambda pg: pg.gloo)
