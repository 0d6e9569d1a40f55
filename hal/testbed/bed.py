"""Emulated hosts on this machine: network + mount + pid + uts namespaces, one veth NIC per rank, a
Linux bridge as the switch, tc shaping per NIC.

    with Testbed(BedSpec.of([2, 2], rate="200 Mb/s")) as bed:
        bed.run(0, ["hostname"])                     # runs inside host 0
        p = bed.popen(1, [sys.executable, "-c", ...], env=...)
        bed.link_down(1, 0); bed.kill_host(1); bed.boot_host(1)

Layout (names are per bed: `hal-<id>-h<h>`, `hal-<id>-sw`):

    host h  (netns hal-<id>-h<h>)          switch (netns hal-<id>-sw)
      rail0  <--veth-->  port h<h>r0 ---+
      rail1  <--veth-->  port h<h>r1 ---+-- bridge br0
      lo                                 ...

- **A different host to every check in the code**: each host is its own network namespace and, for
  its processes, its own mount namespace with a private tmpfs on /dev/shm (another st_dev), its own
  pid namespace and hostname. `hal.emulation.shm.host.same_host_key` compares boot id, /dev/shm device and pid
  namespace: the boot id is the kernel's and stays the same (one kernel), the other two differ, so
  `HAL_CPU_CCL=auto` picks shm only among ranks of one host. Processes enter a host with
  `nsenter -t <host init> -n -m -p -u` (`host_argv`); the host's init is `sleep` as pid 1 of the
  host's pid namespace, so killing it kills every process of the host at once (`kill_host`, a crash;
  `boot_host` starts it again in the same network namespace, as a reboot).
- **NICs and rails**: host h's NIC i (`rail<i>`, address `spec.address(h, i)`) belongs to its local
  rank i. Source-address policy routing (one table per NIC) sends a socket bound to NIC i's address
  (gloo's listening side, `hal.testbed.rank_nic`) out of NIC i; a socket that is not bound (gloo's
  connecting side) follows a /32 route per remote NIC: from the NIC of the local rank that shares a
  bridge rail with the remote rank (`BedSpec.route_nic`; remote NIC j from local NIC j where the
  rails are index-matched, as on a rail-optimized cluster). A sub-cluster may span hosts.
  `arp_ignore`/`arp_announce` keep ARP on the NIC that owns the address
  (several NICs on one L2 segment otherwise answer for each other).
- **Shaping**: tbf at `rate` on the NIC's transmit queue and on its switch port's transmit queue
  (the NIC's receive direction): a port's line rate both ways. Loss: iptables `statistic` random DROP
  on the NIC (OUTPUT -o and INPUT -i) in the host's namespace. Delay needs netem, which is absent
  from some kernels (this one): asking for it raises `TestbedUnavailable` saying so.
- **Cleanup on every exit path**: `down()` (context manager, atexit, SIGTERM/SIGHUP handler, the
  pytest fixture's finalizer) kills the host inits (SIGKILL to a pid-namespace init kills the whole
  host) and deletes the namespaces, which deletes their veths and the bridge; the private /dev/shm
  tmpfs dies with the last process of its mount namespace. A state file per bed under
  `/run/hal-testbed/` lets `hal testbed down` (and `sweep_stale`) remove a bed whose owner died.
  `leftovers()` lists anything of a bed still present (the tests assert it is empty).
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional, Sequence

from hal import envs

from .errors import TestbedSetupError, TestbedSpecError, TestbedUnavailable
from .spec import BedSpec, LinkShape

NS_PREFIX = "hal-tb"
_TABLE_BASE = 100   # policy routing table of NIC i: _TABLE_BASE + i
_LIVE: dict[str, "Testbed"] = {}   # beds this process owns and must take down on exit
_log = logging.getLogger(__name__)


def state_dir() -> Path:
    """Where the state of the beds brought up on this machine is kept (HAL_TESTBED_STATE_DIR)."""
    return Path(envs.HAL_TESTBED_STATE_DIR.get())


def check_available() -> None:
    """Raise `TestbedUnavailable` naming the first missing piece (root, tools, namespaces)."""
    if os.geteuid() != 0:
        raise TestbedUnavailable(f"the test bed needs root (network namespaces, veth, tc); euid is {os.geteuid()}")
    for tool in ("ip", "tc", "nsenter", "unshare"):
        if not shutil.which(tool):
            raise TestbedUnavailable(f"the test bed needs the `{tool}` command (iproute2 / util-linux); not on PATH")
    probe = f"{NS_PREFIX}-probe-{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        raise TestbedUnavailable(f"cannot create a network namespace (`ip netns add`): {r.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)


def _sh(argv: Sequence[str], what: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise TestbedSetupError(f"{what}: `{' '.join(argv)}` exited {r.returncode}: {r.stderr.strip()}")
    return r


class Testbed:
    """One bed: `up()` builds it, `down()` removes every trace (idempotent)."""

    __test__ = False

    def __init__(self, spec: BedSpec, name: Optional[str] = None, persistent: bool = False):
        self.spec = spec
        self.name = name or secrets.token_hex(3)
        if not self.name.isalnum() or len(self.name) > 8:
            raise TestbedSpecError(f"name={self.name!r}: up to 8 letters/digits (it goes into namespace names)")
        self.persistent = persistent   # `hal testbed up`: outlives this process until `hal testbed down`
        self.init_pids: list[Optional[int]] = [None] * spec.hosts
        self._inits: list[Optional[subprocess.Popen]] = [None] * spec.hosts
        self.is_up = False

    # ---- names ------------------------------------------------------------------------------------
    def netns(self, host: int) -> str:
        return f"{NS_PREFIX}-{self.name}-h{host}"

    @property
    def switch_ns(self) -> str:
        return f"{NS_PREFIX}-{self.name}-sw"

    def all_netns(self) -> list[str]:
        return [self.switch_ns] + [self.netns(h) for h in range(self.spec.hosts)]

    @staticmethod
    def nic(local_rank: int) -> str:
        return f"rail{local_rank}"

    @staticmethod
    def port(host: int, local_rank: int) -> str:
        return f"h{host}r{local_rank}"

    def hostname(self, host: int) -> str:
        return f"{NS_PREFIX}-{self.name}-h{host}"

    @property
    def master_addr(self) -> str:
        return self.spec.address(0, 0)

    @property
    def state_file(self) -> Path:
        return state_dir() / f"{self.name}.json"

    # ---- lifecycle --------------------------------------------------------------------------------
    def __enter__(self) -> "Testbed":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> "Testbed":
        check_available()
        if any(s.delay_ms for links in self.spec.links for s in links):
            self._need_qdisc("netem", "a delay")
        if any(s.loss for links in self.spec.links for s in links):
            self._need_iptables()
        _register(self)
        try:
            self._write_state()
            self._build()
            self.is_up = True
            self._write_state()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        sw = self.switch_ns
        for ns in self.all_netns():
            _sh(["ip", "netns", "add", ns], "create namespace")
            _sh(["ip", "-n", ns, "link", "set", "lo", "up"], "loopback up")
        _sh(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"], "create the switch bridge")
        # No spanning tree, no forwarding delay: the ports forward at once, like a plain L2 switch.
        _sh(["ip", "-n", sw, "link", "set", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"],
            "bridge settings")
        _sh(["ip", "-n", sw, "link", "set", "br0", "up"], "bridge up")
        plen = self.spec.prefixlen
        for h in range(self.spec.hosts):
            ns = self.netns(h)
            self._sysctls(ns)
            for i in range(self.spec.ranks[h]):
                nic, port, addr = self.nic(i), self.port(h, i), self.spec.address(h, i)
                _sh(["ip", "link", "add", nic, "netns", ns, "type", "veth", "peer", "name", port, "netns", sw],
                    f"veth for host {h} NIC {i}")
                _sh(["ip", "-n", sw, "link", "set", port, "master", "br0"], f"attach {port} to the switch")
                _sh(["ip", "-n", sw, "link", "set", port, "up"], f"switch port {port} up")
                _sh(["ip", "-n", ns, "addr", "add", f"{addr}/{plen}", "dev", nic], f"address of host {h} {nic}")
                _sh(["ip", "-n", ns, "link", "set", nic, "up"], f"host {h} {nic} up")
                table = str(_TABLE_BASE + i)
                _sh(["ip", "-n", ns, "route", "add", self.spec.subnet, "dev", nic, "src", addr, "table", table],
                    f"routing table of host {h} {nic}")
                _sh(["ip", "-n", ns, "rule", "add", "from", addr, "lookup", table, "pref", str(1000 + i)],
                    f"source rule of host {h} {nic}")
                self.set_shape(h, i, self.spec.links[h][i])
        for h in range(self.spec.hosts):
            self._peer_routes(h)
        for h in range(self.spec.hosts):
            self._start_host(h)

    def _peer_routes(self, h: int) -> None:
        """Routes for sockets that do not bind a source address (gloo's connecting side does not: it
        connects from whatever the route says): each NIC of another host is reached through the NIC
        `spec.route_nic` names (the local member of its rail, else NIC j from NIC j mod n), from that
        NIC's address. So a rail uses exactly its members' own NICs, as on a rail-optimized cluster."""
        ns = self.netns(h)
        for g in range(self.spec.hosts):
            if g == h:
                continue
            for j in range(self.spec.ranks[g]):
                mine = self.spec.route_nic(h, self.spec.first_rank(g) + j)
                _sh(["ip", "-n", ns, "route", "add", f"{self.spec.address(g, j)}/32", "dev", self.nic(mine),
                     "src", self.spec.address(h, mine)], f"route from host {h} to host {g} NIC {j}")

    def _sysctls(self, ns: str) -> None:
        # Several NICs on one L2 segment: answer ARP only on the NIC that owns the address and use it as
        # the source, else host NIC 0 would answer for NIC 1 and carry its traffic; no reverse-path drop.
        # No IPv6 on the host's NICs: an IPv6 link-local address would let gloo (which takes an
        # interface's first address) and the store pick IPv6 on some runs and IPv4 on others.
        cmds = ["echo 1 > /proc/sys/net/ipv4/conf/all/arp_ignore", "echo 2 > /proc/sys/net/ipv4/conf/all/arp_announce",
                "echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter", "echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter",
                "{ [ ! -d /proc/sys/net/ipv6 ] || { echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6 && "
                "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6; }; }"]
        _sh(["ip", "netns", "exec", ns, "sh", "-c", " && ".join(cmds)], f"sysctls of {ns}")

    def _start_host(self, h: int) -> None:
        # pid 1 of the host: mounts its private /dev/shm and /proc, names itself, then sleeps. Started in
        # its own session so that a Ctrl-C in the caller's terminal reaches the caller, who cleans up.
        script = (f"set -e; mount -t tmpfs -o size={self.spec.shm_size},mode=1777 hal-testbed-shm /dev/shm; "
                  f"mount -t proc proc /proc; hostname {self.hostname(h)}; echo ready; exec sleep 2147483647")
        p = subprocess.Popen(["ip", "netns", "exec", self.netns(h), "unshare", "--mount", "--pid", "--uts", "--fork",
                              "--kill-child", "--propagation", "private", "sh", "-c", script],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
        self._inits[h] = p
        assert p.stdout is not None and p.stderr is not None  # both PIPE
        ready, _, _ = select.select([p.stdout], [], [], 20.0)
        line = p.stdout.readline().decode().strip() if ready else ""
        if line != "ready":
            p.kill()
            err = p.stderr.read().decode() if p.poll() is not None else "(still running)"
            raise TestbedSetupError(f"host {h}: its init did not come up (unshare mount+pid+uts, tmpfs on /dev/shm): "
                                    f"said {line!r}, stderr {err.strip()!r}")
        p.stdout.close()
        p.stderr.close()
        children = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
        if len(children) != 1:
            raise TestbedSetupError(f"host {h}: expected one init under unshare pid {p.pid}, found {children}")
        self.init_pids[h] = int(children[0])

    def down(self) -> None:
        """Remove the bed: kill every host (pid namespaces), delete the namespaces (veths, bridge go with
        them), remove the state file. Safe to call twice and on a half-built bed."""
        for h, pid in enumerate(self.init_pids):
            if pid:
                _kill(pid)
            p = self._inits[h]
            if p is not None:
                _kill(p.pid)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        for ns in self.all_netns():
            if Path(f"/run/netns/{ns}").exists():
                for _ in range(50):   # a dying process may still hold it for a moment: retry briefly
                    if _sh(["ip", "netns", "del", ns], "delete namespace", check=False).returncode == 0:
                        break
                    time.sleep(0.1)
        self.init_pids = [None] * self.spec.hosts
        self._inits = [None] * self.spec.hosts
        self.is_up = False
        try:
            self.state_file.unlink()
        except FileNotFoundError:
            pass
        _LIVE.pop(self.name, None)

    def leftovers(self) -> list[str]:
        """What of this bed still exists: namespaces, host processes, the state file (empty when clean)."""
        out = [f"namespace {ns}" for ns in self.all_netns() if Path(f"/run/netns/{ns}").exists()]
        out += [f"host init pid {pid}" for pid in self.init_pids if pid and _alive(pid)]
        if self.state_file.exists():
            out.append(f"state file {self.state_file}")
        return out

    # ---- running inside a host ------------------------------------------------------------------
    def host_argv(self, host: int, argv: Sequence[str], cwd: Optional[str] = None) -> list[str]:
        pid = self._init(host)
        return ["nsenter", "-t", str(pid), "-n", "-m", "-p", "-u", f"--wd={cwd or os.getcwd()}", "--", *argv]

    def popen(self, host: int, argv: Sequence[str], cwd: Optional[str] = None, **kw) -> subprocess.Popen:
        return subprocess.Popen(self.host_argv(host, argv, cwd), **kw)

    def run(self, host: int, argv: Sequence[str], timeout: float = 60.0, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.host_argv(host, argv), timeout=timeout, **kw)

    def _check_host(self, host: int) -> None:
        if not 0 <= host < self.spec.hosts:
            raise TestbedSpecError(f"host={host}: the bed has hosts 0..{self.spec.hosts - 1}")

    def _init(self, host: int) -> int:
        self._check_host(host)
        pid = self.init_pids[host]
        if not pid or not _alive(pid):
            raise TestbedSetupError(f"host {host} of bed {self.name} is not running (killed, or the bed is down)")
        return pid

    # ---- faults and shaping ---------------------------------------------------------------------
    def _check_nic(self, host: int, nic: int) -> None:
        if not 0 <= host < self.spec.hosts or not 0 <= nic < self.spec.ranks[host]:
            raise TestbedSpecError(f"host={host} nic={nic}: the bed has hosts 0..{self.spec.hosts - 1} with "
                                   f"ranks {list(self.spec.ranks)}")

    def link_down(self, host: int, nic: int) -> None:
        """Pull the cable: the switch port goes down (the host's NIC loses carrier, keeps its address and
        routes, so traffic is lost rather than re-routed through another NIC)."""
        self._check_nic(host, nic)
        _sh(["ip", "-n", self.switch_ns, "link", "set", self.port(host, nic), "down"], "link down")

    def link_up(self, host: int, nic: int) -> None:
        self._check_nic(host, nic)
        _sh(["ip", "-n", self.switch_ns, "link", "set", self.port(host, nic), "up"], "link up")

    def processes(self, host: int) -> list[int]:
        """Pids (as this namespace sees them) of every process in the host's pid namespace but its init
        ([] when the host is not running)."""
        self._check_host(host)
        init = self.init_pids[host]
        if not init or not _alive(init):
            return []
        try:
            ns = os.readlink(f"/proc/{init}/ns/pid")
        except OSError:
            return []
        return [pid for pid in _pids() if pid != init and _pid_ns(pid) == ns]

    def kill_host(self, host: int, wait_s: float = 10.0) -> list[int]:
        """Crash the host: SIGKILL to its init, and the kernel kills every process of its pid namespace at
        once (no handler, no clean exit). Waits up to `wait_s` until all are gone; returns their pids.
        What stays is the host's kernel side, which this machine shares: its network namespace, NICs,
        addresses and routes, and the kernel closes the dead processes' sockets (FIN/RST to the peers,
        as after a process crash; pull the host's cables first, `link_down`, for the silence of a power
        loss: the peers hear from the host again only once the cables are back). `boot_host` starts the
        host again."""
        pid = self._init(host)
        members = [pid, *self.processes(host)]
        os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + wait_s
        while any(_alive(p) for p in members) and time.monotonic() < end:
            time.sleep(0.05)
        left = [p for p in members if _alive(p)]
        if left:
            raise TestbedSetupError(f"kill_host({host}): pids {left} of host {host} still alive {wait_s:g} s after "
                                    f"SIGKILL to its init {pid}")
        init = self._inits[host]
        if init is not None:   # unshare, parent of the init: it exits with its child
            try:
                init.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                raise TestbedSetupError(f"kill_host({host}): unshare pid {init.pid} (parent of host {host}'s init) "
                                        f"did not exit within {wait_s:g} s") from None
            self._inits[host] = None
        self.init_pids[host] = None
        self._write_state()
        return members

    def boot_host(self, host: int) -> None:
        """Start a killed host again, as a machine reboots: a fresh init (new pid namespace, empty private
        /dev/shm, the same hostname) in the host's network namespace, whose NICs, addresses, routes and
        shaping stayed. Raises TestbedSetupError when the host still runs or the bed is down."""
        self._check_host(host)
        pid = self.init_pids[host]
        if pid and _alive(pid):
            raise TestbedSetupError(f"boot_host({host}): host {host} of bed {self.name} still runs (init pid {pid}); "
                                    f"kill_host first")
        if not self.is_up:
            raise TestbedSetupError(f"boot_host({host}): bed {self.name} is not up")
        self._start_host(host)
        self._write_state()

    def set_shape(self, host: int, nic: int, shape: LinkShape) -> None:
        """Apply `shape` to host `host` NIC `nic`, both directions (replaces what was there)."""
        self._check_nic(host, nic)
        ns, dev = self.netns(host), self.nic(nic)
        for where, d in ((ns, dev), (self.switch_ns, self.port(host, nic))):
            _sh(["tc", "-n", where, "qdisc", "del", "dev", d, "root"], "clear qdisc", check=False)
            if shape.delay_ms:
                self._need_qdisc("netem", "a delay")
            if shape.rate_bps:
                rate = int(shape.rate_bps)
                # burst: at least one 64 KiB GSO segment and 4 ms of line rate; queue: queue_ms of line rate
                burst = max(65536 + 1514, rate // 8 // 250)
                _sh(["tc", "-n", where, "qdisc", "add", "dev", d, "root", "tbf", "rate", f"{rate}bit",
                     "burst", str(burst), "latency", f"{shape.queue_ms:g}ms"], f"tbf on {where}/{d}")
        # Loss rules are per NIC: replace this NIC's pair, keep the others'
        self._loss_rules(host, nic, shape.loss)

    def _loss_rules(self, host: int, nic: int, loss: float) -> None:
        if not shutil.which("iptables"):
            if loss:
                self._need_iptables()
            return
        ns, dev = self.netns(host), self.nic(nic)
        for chain, flag in (("OUTPUT", "-o"), ("INPUT", "-i")):
            rule = [chain, flag, dev, "-m", "statistic", "--mode", "random", "--probability", "P", "-j", "DROP"]
            # delete any previous rule of this NIC (whatever its probability)
            listed = _sh(["ip", "netns", "exec", ns, "iptables", "-S", chain], "list loss rules", check=False).stdout
            for line in listed.splitlines():
                if f"{flag} {dev} " in line and "statistic" in line:
                    _sh(["ip", "netns", "exec", ns, "iptables", *line.replace("-A ", "-D ", 1).split()],
                        "remove loss rule", check=False)
            if loss:
                rule[rule.index("P")] = f"{loss:.6f}"
                _sh(["ip", "netns", "exec", ns, "iptables", "-A", *rule], f"loss on host {host} {dev}")

    def _need_qdisc(self, kind: str, what: str) -> None:
        probe = f"{NS_PREFIX}-q-{os.getpid()}"
        _sh(["ip", "netns", "add", probe], "probe namespace")
        try:
            r = _sh(["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", kind], f"probe {kind}", check=False)
        finally:
            _sh(["ip", "netns", "del", probe], "probe namespace", check=False)
        if r.returncode != 0:
            raise TestbedUnavailable(f"{what} needs the {kind} qdisc, which this kernel lacks "
                                     f"(`tc qdisc add ... {kind}`: {r.stderr.strip()})")

    def _need_iptables(self) -> None:
        if not shutil.which("iptables"):
            raise TestbedUnavailable("packet loss needs `iptables` (statistic match); not on PATH "
                                     "(Debian: apt-get install iptables)")

    # ---- observation ----------------------------------------------------------------------------
    def nic_bytes(self, host: int) -> dict[str, tuple[int, int]]:
        """{nic: (tx_bytes, rx_bytes)} of a host's NICs, read in its namespace."""
        out = {}
        for i in range(self.spec.ranks[host]):
            stats = f"/sys/class/net/{self.nic(i)}/statistics"
            r = _sh(["ip", "netns", "exec", self.netns(host), "cat", f"{stats}/tx_bytes", f"{stats}/rx_bytes"],
                    "read NIC counters")
            tx, rx = (int(v) for v in r.stdout.split())
            out[self.nic(i)] = (tx, rx)
        return out

    def loss_drops(self, host: int) -> int:
        """Packets the host's loss rules dropped so far (iptables counters), 0 without rules."""
        if not shutil.which("iptables"):
            return 0
        total = 0
        for chain in ("OUTPUT", "INPUT"):
            out = _sh(["ip", "netns", "exec", self.netns(host), "iptables", "-L", chain, "-v", "-x", "-n"],
                      "read loss counters", check=False).stdout
            for line in out.splitlines():
                if "statistic" in line and "DROP" in line:
                    total += int(line.split()[0])
        return total

    # ---- state file (for `hal testbed` across commands and for sweeping a dead owner's bed) ------
    def _write_state(self) -> None:
        state_dir().mkdir(parents=True, exist_ok=True)
        state = {"name": self.name, "owner_pid": os.getpid(), "persistent": self.persistent, "up": self.is_up,
                 "ranks": list(self.spec.ranks), "subnet": self.spec.subnet, "chips": list(self.spec.chips),
                 "links": [[[s.rate_bps, s.delay_ms, s.loss, s.queue_ms] for s in l] for l in self.spec.links],
                 "shm_size": self.spec.shm_size, "init_pids": self.init_pids}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.state_file)

    @classmethod
    def attach(cls, name: str) -> "Testbed":
        """The bed `name` brought up by another process (`hal testbed up`)."""
        path = state_dir() / f"{name}.json"
        try:
            state = json.loads(path.read_text())
        except FileNotFoundError:
            raise TestbedSetupError(f"no test bed {name!r} (no {path}); beds up: {list_beds() or 'none'}") from None
        links = tuple(tuple(LinkShape(rate_bps=r, delay_ms=d, loss=l, queue_ms=q) for r, d, l, q in hl)
                      for hl in state["links"])
        bed = cls(BedSpec(ranks=tuple(state["ranks"]), links=links, subnet=state["subnet"],
                          chips=tuple(state.get("chips", ())), shm_size=state["shm_size"]),
                  name=state["name"], persistent=state["persistent"])
        bed.init_pids = list(state["init_pids"])
        bed.is_up = state["up"]
        return bed


def list_beds() -> list[str]:
    return sorted(p.stem for p in state_dir().glob("*.json")) if state_dir().exists() else []


def sweep_stale() -> list[str]:
    """Take down beds whose owner process died without cleaning up (not `persistent` ones)."""
    swept = []
    for name in list_beds():
        try:
            state = json.loads((state_dir() / f"{name}.json").read_text())
        except (OSError, ValueError):
            continue
        if not state.get("persistent") and not _alive(int(state.get("owner_pid", 0))):
            Testbed.attach(name).down()
            swept.append(name)
    return swept


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"   # a zombie is dead for our purposes


def _pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def _pid_ns(pid: int) -> Optional[str]:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ---- every exit path: atexit and SIGTERM/SIGHUP take down the beds this process owns ------------
_handlers_installed = False


def _down_all() -> None:
    for bed in list(_LIVE.values()):
        if not bed.persistent:
            try:
                bed.down()
            except Exception as exc:  # keep going: the other beds must still come down
                _log.warning("taking down bed %s failed: %s", bed.name, exc)


def _on_signal(signum, frame) -> None:
    _down_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _register(bed: Testbed) -> None:
    global _handlers_installed
    _LIVE[bed.name] = bed
    if not _handlers_installed:
        atexit.register(_down_all)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                if signal.getsignal(sig) in (signal.SIG_DFL, None):
                    signal.signal(sig, _on_signal)
            except ValueError:   # not the main thread: atexit and the caller's context manager remain
                pass
        _handlers_installed = True
