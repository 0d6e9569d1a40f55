"""One validation pass in the launching process, before torchrun starts, shared by every command that
launches ranks (`hal demo`, `hal bench comm`, `hal train`, `hal testbed run`; `hal conformance` uses
its flag and output-path checks), and the launcher's side of a rank failure.

Before launch: flags, the chip environment (`HAL_EMULATE`, `HAL_CLUSTER`, `HAL_CHIP`, `HAL_PLUGINS`),
the cluster spec, output paths (their folder created, or refused, up front) and the world size (from
`--nproc`, the emulation map or the cluster spec). Every problem is a `LaunchError` naming the flag or
variable and its value; `fail()` prints it as one line on stderr and the command exits 2, so no worker
ever starts on bad input. Each rank's chip is resolved with the ranks' own rule
(`hal.core.selection.select_chip`), so the launcher and the ranks cannot disagree.

At run time: a rank that raises writes one marked line (`report_rank_failure`: time, rank, chip,
exception type and message) to stderr before its traceback; `run_ranks` sends the ranks' stderr to a
log file and, if the job fails, prints the earliest such line once and where the full log is, instead
of torchrun's per-rank dump (`print_failure`; `hal testbed run` calls it on its hosts' logs). Ranks
started through `python -m hal.launch.rank_entry` (`run_target`) report without code of their own.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from hal import envs
from hal.contract.errors import HalError

# Ranks one machine may be asked to start: far above any laptop or 8-GPU node, far below a typo.
MAX_LOCAL_RANKS = 256
CHIP_ENV = ("HAL_EMULATE", "HAL_CLUSTER", "HAL_CHIP")
RANK_ERROR_MARK = "[hal rank error]"


class LaunchError(HalError, ValueError):
    """Bad input found before launch; the message names the flag or variable and its value."""


def fail(prog: str, exc: BaseException) -> int:
    """Print `exc` as one line on stderr (`prog: error: ...`) and return exit code 2."""
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    print(f"{prog}: error: {text}", file=sys.stderr, flush=True)
    if os.environ.get("TORCHELASTIC_RUN_ID"):  # a rank under torchrun: the marked line its launcher prints
        report_rank_failure(exc)               # (hal train, hal testbed run), not "exitcode 2"
    return 2


# ---- flags -----------------------------------------------------------------------------------
def check_int(flag: str, value: int, low: int = 1, high: Optional[int] = None) -> int:
    if value is None or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        raise LaunchError(f"{flag} {value}: must be {bound}")
    return value


def check_float(flag: str, value: float, low: float = 0.0, high: Optional[float] = None) -> float:
    """`value` must be > low (and <= high); NaN and inf are refused."""
    if value is None or not (value > low) or value == float("inf") or (high is not None and value > high):
        bound = f"> {low:g}" if high is None else f"> {low:g} and <= {high:g}"
        raise LaunchError(f"{flag} {value}: must be a finite number {bound}")
    return value


def check_output_path(flag: str, path: Optional[str], suffixes: tuple[str, ...] = ()) -> Optional[str]:
    """Absolute path for an output file: its folder is created now, a folder or an unwritable place or a
    suffix the writer does not produce is refused now (not after the whole run)."""
    if path is None:
        return None
    p = Path(path).expanduser()
    if suffixes and p.suffix.lower() not in suffixes:
        raise LaunchError(f"{flag} {path}: this command writes {' or '.join(suffixes)} files; "
                          f"got suffix {p.suffix or '(none)'!r}")
    if p.is_dir():
        raise LaunchError(f"{flag} {path}: is a directory; give a file name")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LaunchError(f"{flag} {path}: cannot create its folder {str(p.parent)!r}: {exc.strerror}") from None
    if not os.access(p.parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise LaunchError(f"{flag} {path}: not writable")
    return str(p.resolve())


def check_output_dir(flag: str, path: Optional[str]) -> Optional[str]:
    """Absolute path of an output folder (a run directory): created now, or refused now when it is a
    file or not writable (not after the ranks have started)."""
    if path is None:
        return None
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise LaunchError(f"{flag} {path}: is a file, not a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LaunchError(f"{flag} {path}: cannot create this folder: {exc.strerror}") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise LaunchError(f"{flag} {path}: not writable")
    return str(p.resolve())


# ---- chips and world size ----------------------------------------------------------------------
def check_plugins(environ: Optional[dict] = None):
    """The plugin manager `HAL_PLUGINS` (or the installed entry points) gives; a LaunchError if not."""
    return _plugin_manager(dict(os.environ if environ is None else environ))


def _plugin_manager(env: dict):
    from hal.core.plugin_manager import PluginManager
    pm = PluginManager()
    try:
        pm.load_entry_points(env)
    except HalError as exc:
        raise LaunchError(f"HAL_PLUGINS={env.get('HAL_PLUGINS', '')!r}: {exc}" if envs.HAL_PLUGINS.is_set(env)
                          else f"loading plugins: {type(exc).__name__}: {exc}") from None
    return pm


def _emulate_count(where: str, text: str, pm) -> Optional[int]:
    """Ranks the map names (None for a bare chip name); unknown chips refused."""
    from hal.emulation.emulate import parse_emulate_map
    try:
        items = parse_emulate_map(text)
    except HalError as exc:
        raise LaunchError(f"{where}: {exc}") from None
    for chip, _ in items:
        if chip not in pm.chips:
            raise LaunchError(f"{where}: no plugin provides chip {chip!r}; known chips: {sorted(pm.chips)}")
    counts = [c for _, c in items]
    if any(c is None for c in counts):
        return None
    return sum(c for c in counts if c is not None)


def check_emulate_map(where: str, text: str, environ: Optional[dict] = None) -> Optional[int]:
    """Ranks an emulation map names (None for a bare chip name), every item and chip checked;
    `where` names the flag or variable in the message (e.g. "--chips cuda:2,ascend:2")."""
    env = dict(os.environ if environ is None else environ)
    return _emulate_count(where, text, _plugin_manager(env))


def plan_ranks(nproc: Optional[int], emulate: Optional[str], environ: Mapping[str, str],
               default_emulate: Callable[[Optional[int]], str], min_ranks: int = 1,
               emulate_label: Optional[str] = None, cluster_label: Optional[str] = None,
               nproc_hint: str = "pass --nproc N", nproc_label: str = "--nproc",
               local_ranks: Optional[Callable[[int, dict], Sequence[int]]] = None) -> tuple:
    """(ranks to start, env for the ranks, how the chips were chosen, (chip, emulated) of every rank),
    everything checked. Every rank's chip is resolved; a native chip is checked against this machine
    only for the ranks this machine starts: `local_ranks(world, env)` (one node of a multi-node launch,
    `hal.launch.nodes.local_ranks_of`), else every rank.

    `emulate` is the `--emulate` flag (it overrides `HAL_EMULATE`; "none" drops it); with neither it
    nor a chip variable set, `default_emulate(nproc)` gives the map. `emulate_label` / `cluster_label`
    name where the map / the cluster spec came from in messages when that is not `--emulate MAP` /
    `HAL_CLUSTER=FILE` (`hal train`: its config's `cluster.emulate` / `cluster.spec`); `nproc_label`
    names where `nproc` came from (`hal testbed run`: the bed's ranks)."""
    env = dict(environ)
    if nproc is not None:
        check_int(nproc_label, nproc, max(1, min_ranks), MAX_LOCAL_RANKS)
    if emulate is not None and not emulate.strip():
        raise LaunchError("--emulate '': names no chip; e.g. --emulate cuda:2,ascend:2")
    where = None  # the flag to blame for the map, when the map came from --emulate
    if emulate == "none":
        env.pop("HAL_EMULATE", None)
        emulate = None
    elif emulate is not None:
        where = emulate_label or f"--emulate {emulate}"
    elif not any(envs.VARIABLES[k].text(env) for k in CHIP_ENV):
        emulate = default_emulate(nproc)
    if emulate is not None:
        env["HAL_EMULATE"] = emulate
        source = where or f"default {emulate}"
    else:
        source = ", ".join(cluster_label if k == "HAL_CLUSTER" and cluster_label else f"{k}={env[k]}"
                           for k in CHIP_ENV if env.get(k)) + ("" if cluster_label else " (from the environment)")
    pm = _plugin_manager(env)

    world = None
    emulate_map = envs.HAL_EMULATE.text(env)
    if emulate_map:
        world = _emulate_count(where or f"HAL_EMULATE={env['HAL_EMULATE']!r}", emulate_map, pm)
    cluster = envs.HAL_CLUSTER.text(env)
    cluster_label = cluster_label or f"HAL_CLUSTER={cluster}"
    if cluster:
        from hal.core.cluster import load_cluster_spec
        try:
            spec = load_cluster_spec(cluster, pm)
        except HalError as exc:
            raise LaunchError(f"{cluster_label}: {exc}") from None
        if world is None and not envs.HAL_CHIP.is_set(env):
            world = spec.world_size
            if world > MAX_LOCAL_RANKS:
                raise LaunchError(f"{cluster_label}: the spec has {world} ranks over {spec.num_nodes} "
                                  f"nodes; this command starts ranks on this machine only (at most "
                                  f"{MAX_LOCAL_RANKS}); launch each node with torchrun instead")
    chip = envs.HAL_CHIP.text(env)
    if chip and chip not in pm.chips:
        raise LaunchError(f"HAL_CHIP={chip!r}: no plugin provides this chip; known chips: {sorted(pm.chips)}")
    if world is not None and nproc is not None and world != nproc:
        what = where or (f"HAL_EMULATE={env['HAL_EMULATE']!r}" if emulate_map
                         else cluster_label)
        raise LaunchError(f"{nproc_label} {nproc}, but {what} names {world} ranks; "
                          + ("drop --nproc or make them agree" if nproc_label == "--nproc" else "make them agree"))
    world = world if world is not None else nproc
    if world is None:
        raise LaunchError(f"cannot tell how many ranks to start from {source}; {nproc_hint}")
    check_int("ranks to start" if nproc is None else nproc_label, world, max(1, min_ranks), MAX_LOCAL_RANKS)
    local = set(range(world) if local_ranks is None else local_ranks(world, env))
    return world, env, source, _check_each_rank(pm, env, world, local)


def _check_each_rank(pm, env: dict, world: int, local: set) -> list[tuple[str, bool]]:
    """Resolve every rank's chip exactly as the rank will (hal.core.selection.select_chip); a native chip
    must be available here only for the ranks in `local` (those this machine starts)."""
    from hal.core.selection import select_chip
    chips = []
    for rank in range(world):
        renv = {**env, "RANK": str(rank), "WORLD_SIZE": str(world)}
        try:
            sel = select_chip(pm, env=renv)
        except HalError as exc:
            raise LaunchError(f"rank {rank} of {world}: {type(exc).__name__}: {exc}") from None
        if not sel.emulated and rank in local and not pm.native_available(sel.chip):
            raise LaunchError(f"rank {rank} of {world}: chip {sel.chip!r} ({sel.reason}) is not natively "
                              f"available on this machine; to run it emulated set HAL_EMULATE={sel.chip}")
        chips.append((sel.chip, sel.emulated))
    return chips


# ---- run time: the first failing rank's own error, once -------------------------------------------
def report_rank_failure(exc: BaseException) -> None:
    """Called by a rank's entry point on an uncaught exception: one marked line on stderr (once per
    exception, however many wrappers report it)."""
    if getattr(exc, "_hal_rank_reported", False):
        return
    try:
        exc._hal_rank_reported = True  # type: ignore[attr-defined]
    except AttributeError:  # an exception type with __slots__: report it, at worst twice
        pass
    rank = os.environ.get("RANK", "?")
    chip = "?"
    try:  # the chip this rank was given, by hal.core.selection's order (HAL_CHIP, HAL_EMULATE, HAL_CLUSTER)
        if envs.HAL_CHIP.is_set():
            chip = envs.HAL_CHIP.text()
        elif envs.HAL_EMULATE.is_set():
            from hal.emulation.emulate import emulated_chip_for_rank
            chip = emulated_chip_for_rank(envs.HAL_EMULATE.text(), int(rank))
        elif envs.HAL_CLUSTER.is_set():
            from hal.core.cluster import load_cluster_spec
            chip = load_cluster_spec(envs.HAL_CLUSTER.text()).assignment(int(rank)).chip
    except Exception:  # noqa: BLE001 - the report must not hide the real error
        pass
    from hal.launch.rootcause import one_line  # the root cause first (DCP's wrapped errors, `raise from`)
    print(f"{RANK_ERROR_MARK} t={time.time():.6f} rank={rank} chip={chip} {one_line(exc)}",
          file=sys.stderr, flush=True)


_MARK_RE = re.compile(re.escape(RANK_ERROR_MARK) + r" t=([0-9.]+) (.*)$")


def first_rank_error(log_text: str) -> Optional[str]:
    """The earliest rank error line in a log ("rank=R chip=C Type: message"), or None."""
    found = [(float(m.group(1)), m.group(2)) for m in map(_MARK_RE.search, log_text.splitlines()) if m]
    return min(found)[1] if found else None


def run_ranks(prog: str, cmd: list[str], env: dict, log: Optional[str] = None) -> int:
    """Run torchrun with the ranks' stderr in a log file (`log`, else a temporary file); on failure
    print the first rank error once."""
    if log is None:
        fd, log = tempfile.mkstemp(prefix=f"{prog.replace(' ', '-')}-", suffix=".log")
        f = os.fdopen(fd, "w")
    else:
        f = open(log, "w")
    with f:  # torchrun dies with this process; Ctrl-C / SIGTERM end it and its ranks (hal.launch.watchdog)
        from hal.launch.watchdog import call_supervised
        code = call_supervised(cmd, env, stderr=f)
    text = Path(log).read_text(errors="replace")
    if code == 0:
        if text.strip():
            print(f"{prog}: the ranks' stderr (warnings) is in {log}", file=sys.stderr)
        else:
            os.unlink(log)
        return 0
    print_failure(prog, code, text, log)
    return code


def print_failure(prog: str, code: int, text: str, log: str) -> None:
    """The launcher's report of a failed job: the first failing rank's own line, once, and the log."""
    first = first_rank_error(text)
    root = None if first else torchrun_root_cause(text)
    if first:
        print(f"{prog}: error: first failing rank: {first}", file=sys.stderr)
    elif root:
        print(f"{prog}: error: first failing rank (torchrun's root cause; it raised no Python exception): "
              f"{root}", file=sys.stderr)
    else:
        last = [ln for ln in text.splitlines() if ln.strip()][-1:] or ["(no output on stderr)"]
        print(f"{prog}: error: a rank exited with code {code} without a Python exception; last stderr line: "
              f"{last[0].strip()[:300]}", file=sys.stderr)
    print(f"{prog}: full log of every rank: {log}", file=sys.stderr)


_ROOT_CAUSE_RE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)[^\n]*\n"
                            r"\s*exitcode\s*:\s*([^\n]*)\n.*?traceback\s*:\s*([^\n]*)", re.S)


def torchrun_root_cause(log_text: str) -> Optional[str]:
    """"rank=R exitcode E: message" from torchrun's ChildFailedError summary (its "Root Cause (first
    observed failure)" block, torch/distributed/elastic/multiprocessing/errors/__init__.py in torch
    2.13), for a rank that died without reporting (a signal, os._exit), or None."""
    m = _ROOT_CAUSE_RE.search(log_text)
    if not m:
        return None
    return f"rank={m.group(1)} exitcode {' '.join(m.group(2).split())}: {m.group(3).strip()[:300]}"


def run_target(argv: list[str]) -> None:
    """Run a rank's target (`-m MODULE ARGS...` or `SCRIPT ARGS...`) as `__main__`; an uncaught
    exception is reported as one marked line (report_rank_failure) before its traceback. The ranks of
    `hal train` and `hal testbed run` start through this (`python -m hal.launch.rank_entry ...`,
    `hal.testbed.rank_nic`), so their launchers print the first failing rank's error once."""
    import runpy
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        raise SystemExit("usage: python -m hal.launch.rank_entry (-m MODULE | SCRIPT) [ARGS...]")
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):  # SystemExit("message"): a refusal
            report_rank_failure(exc)
        raise
    except Exception as exc:
        report_rank_failure(exc)
        raise
