"""One torchrun job on the test bed that runs a list of cases on every rank and prints their results.

    torchrun ... -m hal.testbed.rank_nic -m tests._testbed_job '<json: [[case, args...], ...]>' TIMEOUT_S

Every rank joins the default `hetero` group once (timeout TIMEOUT_S), runs each case (a function of
this module or `module:function`), and prints one line per case:
`TBRESULT {"rank": r, "i": i, "case": name, "ok": bool, "value"|"error"...}`. A case that raises
is reported with its exception type and message, and the job goes on to the next case. The rank
leaves with os._exit (so that a broken group's teardown cannot hang it), non-zero if any case failed.
"""
from __future__ import annotations

import datetime
import importlib
import json
import os
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist

PHASE_DIR = os.environ.get("HAL_TESTBED_PHASE_DIR", "")


def _emit(obj: dict) -> None:
    sys.stdout.write("TBRESULT " + json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def _phase(name: str) -> None:
    """Tell the test (outside the hosts) that this rank reached `name`: a file in a shared directory."""
    if PHASE_DIR:
        with open(os.path.join(PHASE_DIR, f"{name}.{dist.get_rank()}"), "w") as f:
            f.write(str(time.time()))


# ---- cases ---------------------------------------------------------------------------------------
def identity() -> dict:
    """Where this rank runs and what the bridge built: host identity (as hal.emulation.shm compares it), the CPU
    fabric HAL_CPU_CCL=auto picked for its sub-cluster's group, and the NIC its gloo sockets use."""
    import hal.ccl_bridge
    from hal.emulation.shm.host import host_identity
    pg = dist.group.WORLD
    ident = host_identity()
    import hal
    acc = hal.accelerator()
    out = {"rank": dist.get_rank(), "chip": acc.chip.name, "emulated": acc.emulated,
           "node_rank": int(os.environ["GROUP_RANK"]), "hal_cpu_ccl": os.environ.get("HAL_CPU_CCL"),
           "hostname": socket.gethostname(), "shm_dev": ident["shm_dev"], "pid_ns": ident["pid_ns"],
           "boot_id": ident["boot_id"], "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
           "local_rank": int(os.environ["LOCAL_RANK"]), "group_type": type(pg).__name__}
    if isinstance(pg, hal.ccl_bridge.HeteroProcessGroup):
        fx = pg.fabric
        out["intra_pg"] = type(fx.intra.pg).__name__ if fx.intra.pg is not None else None
        out["rails"] = {str(i): type(c.pg).__name__ for i, c in fx.rails.items()}
        out["topology"] = fx.topo.describe()
    return out


def sockets() -> list:
    """Local addresses of this process's established TCP sockets (which NIC address they use)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):   # a dual-stack socket lists in tcp6
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if parts[9] in inodes and parts[3] == "01":   # ESTABLISHED
                out.append([_addr(parts[1]), _addr(parts[2])])
    return out


def _addr(hexaddr: str) -> str:
    ip, port = hexaddr.split(":")
    if len(ip) == 32:   # tcp6: an IPv4-mapped address (::ffff:a.b.c.d) keeps its IPv4 in the last word
        ip = ip[24:] if ip[:24] == "0000000000000000FFFF0000" else ip
        if len(ip) == 32:
            return f"[{ip}]:{int(port, 16)}"
    b = bytes.fromhex(ip)[::-1]
    return f"{'.'.join(str(x) for x in b)}:{int(port, 16)}"


def long_all_reduce(n: int, repeats: int, timeout_s: float, phase: str = "long") -> dict:
    """All_reduce n floats `repeats` times on a fresh `hetero` group with timeout `timeout_s`, each
    result checked; phase file `phase` marks the start of the second one (the test pulls a link or
    kills a host then). Returns the outcome: ok, wrong, or the typed error and how long it took."""
    g = dist.new_group(backend="hetero", timeout=datetime.timedelta(seconds=timeout_s))
    t = torch.empty(n)
    w = dist.get_world_size()
    want = float(w * (w + 1) // 2)
    t0 = t1 = time.monotonic()
    done = 0
    try:
        for i in range(repeats):
            t.fill_(dist.get_rank() + 1)
            if i == 1:
                _phase(phase)
            t1 = time.monotonic()
            dist.all_reduce(t, group=g)
            if not bool((t == want).all()):
                bad = int((t != want).sum())
                return {"outcome": "wrong", "done": done, "bad_elements": bad, "got": t[:4].tolist(), "want": want}
            done += 1
    except Exception as exc:
        return {"outcome": "error", "type": type(exc).__name__, "error": str(exc)[:500], "done": done,
                "seconds": time.monotonic() - t1, "op": getattr(exc, "op", None), "seq": getattr(exc, "seq", None),
                "mro": [c.__name__ for c in type(exc).__mro__]}
    return {"outcome": "ok", "done": done, "seconds": time.monotonic() - t0}


def _resolve(name: str):
    if ":" in name:
        mod, fn = name.split(":")
        return getattr(importlib.import_module(mod), fn)
    return globals()[name]


def main() -> None:
    cases = json.loads(sys.argv[1])
    timeout_s = float(sys.argv[2])
    import hal.ccl_bridge  # noqa: F401 - registers "hetero"
    rank = int(os.environ["RANK"])
    try:
        dist.init_process_group("hetero", timeout=datetime.timedelta(seconds=timeout_s))
    except Exception as exc:
        _emit({"rank": rank, "i": -1, "case": "init", "ok": False, "error_type": type(exc).__name__,
               "error": str(exc)[:2000]})
        os._exit(3)
    failed = False
    for i, (name, *args) in enumerate(cases):
        t0 = time.monotonic()
        try:
            value = _resolve(name)(*args)
            _emit({"rank": rank, "i": i, "case": name, "ok": True, "value": value,
                   "seconds": time.monotonic() - t0})
            failed |= isinstance(value, dict) and value.get("outcome") in ("error", "wrong")
            _phase(f"done{i}")
        except Exception as exc:
            failed = True
            _phase(f"done{i}")
            _emit({"rank": rank, "i": i, "case": name, "ok": False, "error_type": type(exc).__name__,
                   "error": str(exc)[:2000], "traceback": traceback.format_exc()[-3000:],
                   "seconds": time.monotonic() - t0})
    sys.stdout.flush()
    sys.stderr.flush()
    # A failed rank exits non-zero: its torchrun agent then stops at once instead of waiting in the
    # exit barrier (300 s) for agents on a dead host.
    os._exit(1 if failed else 0)


if __name__ == "__main__":
    main()
