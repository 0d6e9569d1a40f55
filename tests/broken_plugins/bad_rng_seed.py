"""Broken plugin: manual_seed() seeds a generator the device's random ops never use (the vendor
seeds its own library's generator, not torch's device generator), so the seed is ignored."""
import hal

from ._base import install

BUG = "runtime.manual_seed ignores the seed"
CAUGHT_BY = "runtime.rng_determinism"
LEVELS = ["runtime"]
SELECT = ["runtime.rng_determinism", "runtime.synchronize"]
STILL_PASSES = ["runtime.synchronize"]


class Runtime(hal.CpuRuntime):
    def manual_seed(self, seed):
        import random
        random.Random(seed)  # the bug: a generator nobody draws from


install(globals(), "bad_rng_seed", BUG, runtime=Runtime)
