"""`hal testbed`: a multi-host test bed on this machine (root): emulated hosts as network + mount + pid
namespaces, one veth NIC per rank on a Linux-bridge switch, tc-shaped links; torchrun across them.

  hal testbed up --ranks 2,2 --rate 200Mb/s --chips cuda:2,ascend:2   # prints the bed's name
  hal testbed up --cluster examples/clusters/h800-910b-32.toml --scale 1000 --max-rate 400Mb/s
  hal testbed run -- -m hal.cli.bench comm --backend hetero --baseline gloo --max-bytes 64M
  hal testbed run --timeout 300 -- train.py --steps 10     # any torchrun target, one agent per host
  hal testbed exec --host 1 -- ip -br addr                # a command inside host 1
  hal testbed status                                      # beds up, their hosts, NICs and shaping
  hal testbed down                                        # take the bed down (--all: every bed)

`run` starts on every host h: torchrun --nnodes H --nproc-per-node <ranks of h> --node-rank h
--master-addr <host 0 NIC 0> --master-port P -m hal.testbed.rank_nic TARGET..., with HAL_EMULATE from
--chips, HAL_RANK_NICS so local rank i binds gloo to NIC rail<i>, HAL_CPU_CCL=auto (shm inside a
host, gloo across). A bed from `up` stays until `down` (it is not tied to the shell that made it).
Addresses are in a private range (default 10.213.0.0/16) that exists only inside the bed.

Before `run` starts any agent, --timeout and the ranks' chip environment (the bed's --chips, --env,
HAL_EMULATE / HAL_CLUSTER / HAL_CHIP / HAL_PLUGINS) are checked for the bed's rank count
(hal.launch.check). When a rank fails, the other hosts are stopped 10 s later and the first failing
rank's own error is printed once (rank, chip, exception and message) with the path of every host's
full log, instead of each host's output.

exit codes (run): 0 every host's job exited 0; 1 a rank failed (torchrun's code); 124 stopped at
--timeout; 2 bad input or no such bed (nothing started).
"""
from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="testbed_cmd", metavar="CMD")
    up = sub.add_parser("up", help="build a bed and leave it up (prints its name)")
    up.add_argument("--ranks", default="2,2", help="ranks (= NICs) per host, comma-separated (default 2,2)")
    up.add_argument("--rate", default=None, help="line rate of every NIC, e.g. 200Mb/s, 1Gb/s (default unshaped)")
    up.add_argument("--loss", type=float, default=0.0, help="random loss per NIC and direction, fraction (0.05 = 5%%)")
    up.add_argument("--delay-ms", type=float, default=0.0, help="delay per NIC (needs the netem qdisc)")
    up.add_argument("--chips", default=None, help="HAL_EMULATE map by global rank for `run`, e.g. cuda:2,ascend:2")
    up.add_argument("--cluster", default=None, metavar="FILE",
                    help="take hosts, ranks and NIC rates from a cluster spec (nic_bandwidth / --scale)")
    up.add_argument("--scale", type=float, default=1000.0,
                    help="with --cluster: divide NIC rates by this (default 1000)")
    up.add_argument("--max-rate", default=None, help="with --cluster: cap every NIC at this rate")
    up.add_argument("--subnet", default=None, help="private IPv4 range inside the bed (default 10.213.0.0/16)")
    up.add_argument("--name", default=None, help="bed name, up to 8 letters/digits (default random)")
    run = sub.add_parser("run", help="torchrun a target across the bed's hosts")
    run.add_argument("--name", default=None, help="which bed (default: the only one up)")
    run.add_argument("--timeout", type=float, default=600.0, help="stop the job after this many seconds (default 600)")
    run.add_argument("--env", action="append", default=[], metavar="K=V", help="extra environment for every rank")
    run.add_argument("target", nargs=argparse.REMAINDER, help="after --: -m MODULE ARGS... or SCRIPT ARGS...")
    ex = sub.add_parser("exec", help="run a command inside one host")
    ex.add_argument("--name", default=None)
    ex.add_argument("--host", type=int, default=0)
    ex.add_argument("argv", nargs=argparse.REMAINDER, help="after --: the command")
    st = sub.add_parser("status", help="list the beds that are up")
    st.add_argument("--name", default=None)
    down = sub.add_parser("down", help="take a bed down, leaving nothing behind")
    down.add_argument("--name", default=None)
    down.add_argument("--all", action="store_true", help="every bed on this machine")


def _pick(name):
    from hal.testbed.bed import Testbed, list_beds
    from hal.testbed.errors import TestbedSetupError
    beds = list_beds()
    if name is None:
        if len(beds) != 1:
            raise TestbedSetupError(f"{len(beds)} beds are up ({beds or 'none'}): name one with --name")
        name = beds[0]
    return Testbed.attach(name)


def _strip(argv: list[str]) -> list[str]:
    return argv[1:] if argv and argv[0] == "--" else argv


def run(args: argparse.Namespace) -> int:
    from hal.testbed.bed import Testbed, list_beds
    from hal.testbed.errors import TestbedSpecError
    from hal.testbed.spec import BedSpec, parse_rate
    cmd = getattr(args, "testbed_cmd", None)
    if cmd == "up":
        if args.cluster:
            from hal.core.cluster import load_cluster_spec
            spec = BedSpec.from_cluster(load_cluster_spec(args.cluster), scale=args.scale, max_rate=args.max_rate,
                                        **({"subnet": args.subnet} if args.subnet else {}))
        else:
            try:
                ranks = [int(x) for x in args.ranks.split(",")]
            except ValueError:
                raise TestbedSpecError(f"--ranks {args.ranks!r}: expected integers such as 2,2 or 2,1,1") from None
            chips: list[str] = []
            if args.chips:
                from hal.launch.check import LaunchError, check_emulate_map
                mapped = check_emulate_map(f"--chips {args.chips}", args.chips)  # before the bed is built
                if mapped is not None and mapped != sum(ranks):
                    raise LaunchError(f"--chips {args.chips} maps {mapped} ranks but --ranks {args.ranks} "
                                      f"has {sum(ranks)}")
                from hal.emulation.emulate import emulated_ranks
                chips = emulated_ranks(args.chips, sum(ranks)) or [args.chips.strip()] * sum(ranks)
            spec = BedSpec.of(ranks, rate=parse_rate(args.rate), loss=args.loss, delay_ms=args.delay_ms,
                              chips=chips, **({"subnet": args.subnet} if args.subnet else {}))
        bed = Testbed(spec, name=args.name, persistent=True).up()
        print(f"test bed {bed.name} is up: {spec.hosts} host(s), {spec.world_size} rank(s); master {bed.master_addr}")
        for line in spec.describe():
            print("  " + line)
        print(f"next: hal testbed run --name {bed.name} -- -m MODULE ...   then: hal testbed down --name {bed.name}")
        return 0
    if cmd == "run":
        from hal.launch.check import check_float
        check_float("--timeout", args.timeout, 0.0, 7 * 86_400.0)
        from hal.testbed.launch import launch
        target = _strip(args.target)
        if not target:
            raise TestbedSpecError("hal testbed run: give a target after --, e.g. -- -m hal.cli.bench comm")
        env = {}
        for kv in args.env:
            if "=" not in kv:
                raise TestbedSpecError(f"--env {kv!r}: expected K=V")
            k, v = kv.split("=", 1)
            env[k] = v
        bed = _pick(args.name)
        _check_chips(bed, env)  # HAL_* of the ranks checked before any agent starts (hal.launch.check)
        job = launch(bed, target, env=env)
        # a failed host: the others are stopped 10 s later (they would wait for it until --timeout)
        result = job.wait(args.timeout, stop_after_failure=10.0)
        return _report(result, args.timeout)
    if cmd == "exec":
        bed = _pick(args.name)
        argv = _strip(args.argv)
        if not argv:
            raise TestbedSpecError("hal testbed exec: give a command after --")
        r = bed.run(args.host, argv, capture_output=False, text=True, timeout=600)
        return r.returncode
    if cmd == "status":
        names = [args.name] if args.name else list_beds()
        if not names:
            print("no test bed is up")
        for n in names:
            bed = Testbed.attach(n)
            alive = ["up" if pid and _alive(pid) else "down" for pid in bed.init_pids]
            print(f"test bed {n}: hosts {alive}, master {bed.master_addr}")
            for line in bed.spec.describe():
                print("  " + line)
        return 0
    if cmd == "down":
        names = list_beds() if args.all else [_pick(args.name).name]
        for n in names:
            bed = Testbed.attach(n)
            bed.down()
            left = bed.leftovers()
            print(f"test bed {n}: down" + (f"; left behind: {left}" if left else ", nothing left behind"))
        return 0
    print("usage: hal testbed up|run|exec|status|down (see `hal testbed --help`)", file=sys.stderr)
    return 2


def _check_chips(bed, extra: dict) -> None:
    """The chip environment every rank will get (this shell's, the bed's --chips, --env), checked
    with the launching commands' rules for the bed's world size: one line and exit 2 on bad input."""
    import os

    from hal import envs
    from hal.launch.check import CHIP_ENV, LaunchError, check_plugins, plan_ranks
    from hal.testbed.launch import job_env
    env = {**os.environ, **job_env(bed, 0, extra)}
    if not any(envs.VARIABLES[k].text(env) for k in CHIP_ENV):
        check_plugins(env)  # HAL_PLUGINS; every rank takes the chip the machine has (hal.accelerator's default)
        return

    def no_default(_):
        raise LaunchError("unreachable: a chip variable is set")
    plan_ranks(bed.spec.world_size, None, env, no_default, nproc_label=f"test bed {bed.name}'s rank count")


def _report(result, timeout: float) -> int:
    """Every host's output when the job succeeded; otherwise the first failing rank's own error once
    and where the full log of every host is (not torchrun's per-rank dump)."""
    import tempfile

    from hal.launch.check import print_failure
    if result.ok:
        for h in result.hosts:
            print(f"===== host {h.host} (torchrun node {h.host}, exit {h.returncode}) =====")
            sys.stdout.write(h.output)
        return 0
    text = "".join(f"===== host {h.host} (torchrun node {h.host}, exit {h.returncode}"
                   f"{', killed' if h.killed else ''}) =====\n{h.output}" for h in result.hosts)
    with tempfile.NamedTemporaryFile("w", prefix="hal-testbed-run-", suffix=".log", delete=False) as f:
        f.write(text)
    if result.timed_out:
        print(f"hal testbed run: error: stopped after {timeout:g}s (--timeout); {result.describe()}",
              file=sys.stderr)
        print(f"hal testbed run: full log of every host: {f.name}", file=sys.stderr)
        return 124
    # the failed agents' code (torchrun's), not the signal of the hosts stopped after them
    code = max((h.returncode for h in result.hosts if not h.killed and h.returncode), default=1)
    print_failure("hal testbed run", code, text, f.name)
    return code


def _alive(pid: int) -> bool:
    from hal.testbed.bed import _alive as alive
    return alive(pid)
