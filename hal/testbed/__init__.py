"""A multi-host test bed on one Linux machine: emulated hosts as namespaces with one NIC per rank on
a bridge switch, shaped links, and torchrun across them (see `hal.testbed.bed`, `hal.testbed.launch`).

Needs root; `hal.testbed.bed.check_available()` says why not otherwise. `hal testbed up|run|down` is the
command line. hal never imports this package (it sits above hal, beside benchmarks).
"""
from .bed import Testbed, check_available, list_beds, sweep_stale
from .errors import TestbedError, TestbedSetupError, TestbedSpecError, TestbedUnavailable
from .spec import BedSpec, LinkShape, parse_rate

__all__ = ["BedSpec", "LinkShape", "Testbed", "TestbedError", "TestbedSetupError", "TestbedSpecError",
           "TestbedUnavailable", "check_available", "list_beds", "parse_rate", "sweep_stale"]
