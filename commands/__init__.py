"""commands: the `hal` subcommands of the layers above hal, one module each (bench, demo, conformance,
plan, simulate, train, testbed).

`hal/cli.py` names each by module path in its SUBCOMMANDS table and imports it only when chosen, so
hal itself imports nothing above it. A module here has `add_arguments(parser)` and `run(args) -> int`
and may import any layer (ccl_bridge, strategies, conformance, benchmarks); no library package
imports commands.
"""
