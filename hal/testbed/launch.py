"""torchrun across the bed's hosts: one agent per host, static rendezvous on host 0's NIC 0.

    job = launch(bed, ["-m", "hal.cli.bench", "comm", ...], env={"HAL_EMULATE": "cuda:2,ascend:2"})
    result = job.wait(timeout=120)        # every agent's exit code and output; kills the job on timeout

What each host runs is what a real node runs (docs/mixed-cluster.md, section 4):

    torchrun --nnodes H --nproc-per-node <ranks on this host> --node-rank h \
             --master-addr <host 0 NIC 0> --master-port P --max-restarts 0 \
             -m hal.testbed.rank_nic <target...>

with the static rendezvous (torchrun's default with --master-addr/--node-rank), so node h gets the
global ranks after hosts 0..h-1 in order -- the cluster spec's rank order, hosts of uneven size
included -- and `HAL_RANK_NICS=rail0,rail1,...` so that local rank i binds gloo to NIC i
(`hal.testbed.rank_nic`). `HAL_CPU_CCL` stays `auto` unless the caller sets it.
"""
from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from .bed import Testbed, _alive
from .errors import TestbedSetupError

_ports = itertools.count(29500 + os.getpid() % 1000)


@dataclass
class HostRun:
    host: int
    returncode: Optional[int]   # None: still running when the job was stopped
    output: str
    killed: bool = False


@dataclass
class JobResult:
    hosts: list[HostRun]
    seconds: float
    timed_out: bool = False
    lines: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(h.returncode == 0 for h in self.hosts)

    def describe(self) -> str:
        return "; ".join(f"host {h.host}: rc={h.returncode}{' (killed)' if h.killed else ''}" for h in self.hosts)

    def tail(self, chars: int = 4000) -> str:
        return "\n".join(f"--- host {h.host} (rc={h.returncode}) ---\n{h.output[-chars:]}" for h in self.hosts)


def torchrun_argv(bed: Testbed, host: int, target: Sequence[str], master_port: int,
                  monitor_interval: float = 0.2) -> list[str]:
    spec = bed.spec
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(spec.hosts),
            "--nproc-per-node", str(spec.ranks[host]), "--node-rank", str(host),
            "--master-addr", bed.master_addr, "--master-port", str(master_port),
            "--max-restarts", "0", "--monitor-interval", str(monitor_interval),
            "-m", "hal.testbed.rank_nic", *target]


def job_env(bed: Testbed, host: int, env: Optional[dict] = None) -> dict:
    """The environment of host `host`'s agent: the caller's, HAL_EMULATE from the bed's chips (global
    rank order; not when a cluster spec HAL_CLUSTER gives the chips), HAL_RANK_NICS for its NICs, one
    OpenMP thread per rank (a few cores serve many ranks)."""
    out = dict(os.environ)
    out.setdefault("OMP_NUM_THREADS", "1")
    if bed.spec.chips and not (env or {}).get("HAL_CLUSTER") and not out.get("HAL_CLUSTER"):
        out["HAL_EMULATE"] = ",".join(f"{c}:{len(list(g))}" for c, g in itertools.groupby(bed.spec.chips))
    out["HAL_RANK_NICS"] = ",".join(bed.nic(i) for i in range(bed.spec.ranks[host]))
    out.pop("GLOO_SOCKET_IFNAME", None)
    out.update(env or {})
    return out


class Job:
    """One torchrun job: an agent per host, output to a file per host (read after it ends)."""

    def __init__(self, bed: Testbed, target: Sequence[str], env: Optional[dict] = None,
                 hosts_env: Optional[dict[int, dict]] = None, master_port: Optional[int] = None,
                 cwd: Optional[str] = None):
        self.bed = bed
        self.port = master_port or next(_ports)
        self.started = time.monotonic()
        self._dir = tempfile.TemporaryDirectory(prefix=f"hal-testbed-{bed.name}-")
        self.procs: list[subprocess.Popen] = []
        self._files = []
        for h in range(bed.spec.hosts):
            e = job_env(bed, h, {**(env or {}), **((hosts_env or {}).get(h, {}))})
            f = open(Path(self._dir.name) / f"host{h}.log", "w+b")
            self._files.append(f)
            self.procs.append(bed.popen(h, torchrun_argv(bed, h, target, self.port), cwd=cwd, env=e,
                                        stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT))

    def output(self, host: int) -> str:
        f = self._files[host]
        f.flush()
        return (Path(self._dir.name) / f"host{host}.log").read_text(errors="replace")

    def wait(self, timeout: float, stop_after_failure: Optional[float] = None) -> JobResult:
        """Wait for every agent; past `timeout` (seconds since launch) stop the job: SIGTERM to each
        agent (torchrun then stops its workers), then SIGKILL to everything left in the host except
        its init. Never hangs: returns within timeout + about 10 s. With `stop_after_failure`, the
        other hosts are stopped that many seconds after one host's agent exits non-zero (their
        agents would otherwise wait in torchrun's exit barrier, or their ranks in a collective with
        the dead ones, until `timeout`); that is not a time-out."""
        deadline = self.started + timeout
        stop_at = None  # when the hosts left are stopped because one failed
        while time.monotonic() < min(deadline, stop_at or deadline) and any(p.poll() is None for p in self.procs):
            if stop_after_failure is not None and stop_at is None and any(p.poll() not in (None, 0)
                                                                          for p in self.procs):
                stop_at = time.monotonic() + stop_after_failure
            time.sleep(0.1)
        running = any(p.poll() is None for p in self.procs)
        timed_out = running and (stop_at is None or deadline <= stop_at)
        killed = [False] * len(self.procs)
        if running:
            for h, p in enumerate(self.procs):
                if p.poll() is None:
                    killed[h] = True
                    self.stop_host(h)
        result = JobResult(hosts=[], seconds=time.monotonic() - self.started, timed_out=timed_out)
        for h, p in enumerate(self.procs):
            result.hosts.append(HostRun(host=h, returncode=p.poll(), output=self.output(h), killed=killed[h]))
        for f in self._files:
            f.close()
        self._dir.cleanup()
        result.lines = [line for h in result.hosts for line in h.output.splitlines()]
        return result

    def stop_host(self, host: int, grace: float = 5.0) -> None:
        """Stop this job's processes on one host (not the host itself)."""
        p = self.procs[host]
        pids = host_processes(self.bed, host)
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        end = time.monotonic() + grace
        while time.monotonic() < end and any(_alive(pid) for pid in pids):
            time.sleep(0.1)
        for pid in host_processes(self.bed, host):
            _signal(pid, signal.SIGKILL)
        if p is not None:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


def launch(bed: Testbed, target: Sequence[str], env: Optional[dict] = None, **kw) -> Job:
    if not bed.is_up:
        raise TestbedSetupError(f"bed {bed.name} is not up")
    return Job(bed, target, env, **kw)


def host_processes(bed: Testbed, host: int) -> list[int]:
    """Pids (as this namespace sees them) of every process in the host's pid namespace but its init."""
    return bed.processes(host)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
