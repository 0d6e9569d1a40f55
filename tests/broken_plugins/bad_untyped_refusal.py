"""Broken plugin: undeclared combinations are refused with whatever the CCL raises (RuntimeError).

The hookspec asks for `hal.NotSupportedError`, which is what the bridge and training code catch to
fall back; a bare RuntimeError looks like a crash. Here the plugin hands every call to raw gloo.
"""
from ._base import install

BUG = "undeclared combinations raise RuntimeError, not hal.NotSupportedError"
CAUGHT_BY = "collectives.all_reduce.float8_e4m3fn.sum"
LEVELS = ["collectives"]
SELECT = ["collectives.all_reduce.float8_e4m3fn.sum", "collectives.all_reduce.float32.sum"]
STILL_PASSES = ["collectives.all_reduce.float32.sum"]
MESSAGE = ["NotSupportedError", "RuntimeError"]

install(globals(), "bad_untyped_refusal", BUG, typed_refusals=False)
