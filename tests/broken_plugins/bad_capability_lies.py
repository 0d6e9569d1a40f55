"""Broken plugin: the capability matrix claims int16 and float8 reductions and PREMUL_SUM that its
CCL (gloo underneath) refuses: the matrix was copied from another vendor's documentation instead
of measured."""
import hal
from hal.contract.capabilities import REDUCING
from hal.emulation.emulate import cpu_fabric_capabilities

from ._base import install

BUG = "capability matrix declares int16/float8 reductions and premul_sum the CCL does not do"
CAUGHT_BY = "collectives.all_reduce.int16.sum"
LEVELS = ["collectives"]
SELECT = ["collectives.all_reduce.int16.sum", "collectives.all_reduce.float32.premul_sum",
          "collectives.all_reduce.float32.sum", "collectives.all_reduce.int32.sum"]
STILL_PASSES = ["collectives.all_reduce.float32.sum", "collectives.all_reduce.int32.sum"]
ALSO_FAILS = ["collectives.all_reduce.float32.premul_sum"]

_claimed = hal.CapabilityMatrix.build("bad_capability_lies", "copied from another vendor's docs",
                                      collectives=REDUCING, dtypes=("int16", "float8_e4m3fn", "float32"),
                                      reduce_ops=("sum", "premul_sum"))
CAPS = hal.CapabilityMatrix(chip="bad_capability_lies",
                            entries=cpu_fabric_capabilities("gloo").entries | _claimed.entries,
                            source="copied from another vendor's documentation (not measured)")

install(globals(), "bad_capability_lies", BUG, capabilities=CAPS)
