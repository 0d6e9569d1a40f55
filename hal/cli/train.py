"""`hal train --config train.toml`: train one model across a (mixed) cluster as the config says
(hal.trainer.config). Not under torchrun, it launches torchrun with one rank per rank of the configured
cluster (`cluster.emulate`, `cluster.spec`, else HAL_EMULATE / HAL_CLUSTER): on this machine, or on
several nodes with the same command on every node (`--nnodes/--node-rank/--rdzv-endpoint`, Slurm's
variables under srun, or `cluster.nodes`: hal.launch.nodes; docs/mixed-cluster.md). Under torchrun it
runs the loop directly.

examples:
  hal train --config examples/train/tiny.toml
  hal train --config examples/train/tiny.toml --steps 100 --run-dir runs/short
  hal train --config examples/train/tiny.toml --plan auto
  hal train --config /shared/train.toml --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29400   # each node
  srun --ntasks-per-node=1 hal train --config /shared/train.toml                              # examples/slurm/

Writes <run dir>/metrics.jsonl, summary.json and checkpoints/ (docs/training.md), and the ranks'
stderr to <run dir>/ranks.log (the next launch in the folder: ranks.1.log, ...).

Before torchrun starts, the config, the overrides, the chips (cluster.emulate / cluster.spec, else
HAL_EMULATE / HAL_CLUSTER / HAL_CHIP / HAL_PLUGINS), the data paths, the Plan (even / file) on that
cluster and the run's folders are checked (hal.launch.check), on every node, and the nodes agree (one
node's problem stops all); a problem is one line naming the field, flag or variable and its value. One
job per run folder (hal.launch.runlock). If a rank fails, the first failing rank's root cause is printed
once, with the path of the ranks' log. torchrun and the ranks end with this process, however it ends
(hal.launch.watchdog).

`hal train` needs rich (progress bar) and matplotlib (plots), the optional [train] extra:
pip install 'hetero-hal[train]'.

exit codes: 0 trained; 1 a rank failed; 2 bad input, the run folder held by another job, or the [train]
extra missing (nothing started); 130 Ctrl-C; 143 SIGTERM.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from typing import Optional

from hal.trainer.args import _OVERRIDES, add_arguments, config_env, load  # noqa: F401 - hal/cli/__init__.py calls add_arguments

TRAIN_EXTRA = ("rich", "matplotlib")  # pyproject.toml's [train] extra


def _installed(module: str) -> bool:
    if module in sys.modules:  # None there: imports of it fail
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_train_extra() -> None:
    """A LaunchError naming the [train] extra when rich or matplotlib is not installed."""
    from hal.launch.check import LaunchError
    missing = [m for m in TRAIN_EXTRA if not _installed(m)]
    if missing:
        raise LaunchError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed: "
                          f"hal train needs the [train] extra: pip install 'hetero-hal[train]'")


def plan(cfg, args: argparse.Namespace, environ: dict, node=None) -> tuple:
    """(ranks to start, env for the ranks, how the chips were chosen, (chip, emulated) per rank), with
    the config's chips, the chip environment, its files, its Plan and the run's folders checked
    before torchrun starts (hal.launch.check: the launching commands' one validation pass). A
    problem is a LaunchError / TrainConfigError naming the config field, flag or variable and value.
    On one node of several (`node`), native chips are checked here only for that node's own ranks."""
    from hal.launch.check import LaunchError, check_int, check_output_dir, plan_ranks
    from hal.launch.nodes import local_ranks_of
    from hal.core.topology import Topology

    from hal.trainer.config import TrainConfigError
    check_int("--max-restarts", getattr(args, "max_restarts", 0), 0, 100)
    env = config_env(cfg, environ)  # the config names the chips and timing: it wins over HAL_* (the ranks apply it too)
    emulate = emulate_label = cluster_label = None
    if cfg.cluster.emulate:
        emulate, emulate_label = cfg.cluster.emulate, f"cluster.emulate = {cfg.cluster.emulate!r} ({args.config})"
    elif cfg.cluster.spec:
        cluster_label = f"cluster.spec = {cfg.cluster.spec!r} ({args.config})"

    def no_cluster(_):
        raise LaunchError(f"{args.config}: no cluster to train on: set cluster.emulate (e.g. 'cuda:2,ascend:2') "
                          f"or cluster.spec in the config, or HAL_EMULATE / HAL_CLUSTER in the environment")
    nproc, env, source, chips = plan_ranks(
        None, emulate, env, no_cluster, emulate_label=emulate_label, cluster_label=cluster_label,
        nproc_hint="give counts (cluster.emulate = 'cuda:2,ascend:2') or a cluster.spec in the config",
        local_ranks=local_ranks_of(node) if node is not None and node.multi else None)
    for p in cfg.data.paths if cfg.data.source == "files" else ():
        if not cfg.resolve(p).exists():
            raise TrainConfigError("data.paths", p, f"no such file or folder ({cfg.resolve(p)})")
    from hal.trainer.trainer import make_plan  # the Plan the ranks will build (auto: searched here too),
    make_plan(cfg, Topology.from_env(env, world_size=nproc), cfg.load_model_config(), None)  # and its memory
    check_output_dir("--run-dir" if getattr(args, "run_dir", None) else "log.dir", str(cfg.run_dir))
    if cfg.checkpoint.enabled:
        check_output_dir("checkpoint.dir", str(cfg.checkpoint_dir))
    env.setdefault("OMP_NUM_THREADS", "1")
    return nproc, env, source, chips


def run(args: argparse.Namespace) -> int:
    if getattr(args, "check_checkpoints", None):  # only list the checkpoints' states (hal.trainer.integrity)
        from hal.trainer.integrity import check_command
        return check_command(args.check_checkpoints)
    from hal.contract.errors import HalError
    from hal.launch.check import fail
    if os.environ.get("TORCHELASTIC_RUN_ID") or ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        return _run_rank(args)
    try:
        check_train_extra()
        cfg = load(args)
    except HalError as exc:
        return fail("hal train", exc)
    try:
        launch = _prelaunch(cfg, args)
    except HalError as exc:
        return fail("hal train", exc)
    if launch is None:
        return 0
    node, nproc, env, source, chips, lock = launch
    try:
        if getattr(args, "measure_parts", False):  # each sub-cluster alone and Plan.even first (hal/trainer/parts.py)
            from hal.trainer.parts import measure
            try:
                code = measure(args, cfg, run)
            except HalError as exc:
                return fail("hal train --measure-parts", exc)
            if code != 0:
                return code
        return _launch(cfg, args, node, nproc, env, source, chips)
    finally:
        if lock is not None:
            lock.release()


def _run_rank(args: argparse.Namespace) -> int:
    """Under torchrun (a rank): the config's settings applied, then the loop; a bad config is this
    rank's one marked error line (hal.launch.check.fail under torchrun), so `hal testbed run` and
    `hal train`'s launcher print it, not "exitcode 2"."""
    from hal.contract.errors import HalError
    from hal.launch.check import fail
    from hal.trainer.args import apply_config_env
    try:
        check_train_extra()
        cfg = load(args)
    except HalError as exc:  # under torchrun fail() also writes the rank's marked line
        return fail("hal train", exc)
    from hal.trainer.console import setup_console
    from hal.trainer.loop import exit_failed, train
    apply_config_env(cfg)
    setup_console()
    try:
        train(cfg)
    except BaseException as exc:  # exit now; torchrun restarts the job (hal/trainer/elastic.py)
        exit_failed(exc)
    return 0


def _prelaunch(cfg, args: argparse.Namespace):
    """Every check before torchrun, on every node: this node's place (hal.launch.nodes), the config,
    chips, plan and folders (`plan`), the run folder's lock (node 0), and, on several nodes, every
    node's result agreed (a problem on one stops all with its line). None: the run is finished already.
    Returns (node, ranks on this node, env, chips source, chips, the held lock or None)."""
    from hal.contract.errors import HalError
    from hal.launch.nodes import agree, local_ranks_of, resolve
    from hal.launch.runlock import RunLock
    node = resolve(getattr(args, "nnodes", None), getattr(args, "node_rank", None),
                   getattr(args, "rdzv_endpoint", None), cfg.cluster.nodes, os.environ)
    problem, lock, launch = None, None, None
    try:
        nproc, env, source, chips = plan(cfg, args, os.environ, node)
        if node.multi and getattr(args, "measure_parts", False):
            from hal.launch.check import LaunchError
            raise LaunchError(f"--measure-parts runs on one node; this job has {node.nnodes} ({node.source})")
        local = len(local_ranks_of(node)(nproc, env))
        if node.node_rank == 0:
            lock = RunLock(cfg.run_dir).acquire()  # one job per run folder, held for the job's life
        launch = (node, local, env, source, chips, lock)
    except HalError as exc:
        if not node.multi:
            raise
        problem = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if node.multi:
        try:
            agree(node, problem, args.node_timeout)
        except HalError:
            if lock is not None:
                lock.release()
            raise
    elif launch is not None and _finished(cfg):
        lock.release()
        return None
    return launch
def _launch(cfg, args: argparse.Namespace, node, nproc: int, env: dict, source: str, chips) -> int:
    """torchrun for this node's ranks (the static rendezvous on the endpoint on several nodes), the
    ranks' stderr in this launch's own log (`ranks_log`), torchrun's log folder inside the run folder
    (removed when it holds no file); the ranks end with this process (hal.launch.watchdog)."""
    from hal.launch.check import run_ranks
    from hal.testing import free_port  # the one free-port helper (hal.testing exports it)
    where = node.torchrun_args() if node.multi else ["--nnodes", "1", "--master-addr", "127.0.0.1",
                                                     "--master-port", str(free_port())]
    elastic_dir = cfg.run_dir / ("torchelastic" if not node.multi else f"torchelastic-node{node.node_rank}")
    # hal.launch.rank_entry runs hal.trainer.loop and reports an uncaught error as one line for run_ranks
    cmd = [sys.executable, "-m", "torch.distributed.run", *where, "--nproc-per-node", str(nproc),
           "--max-restarts", str(getattr(args, "max_restarts", 0)), "--log-dir", str(elastic_dir),
           "-m", "hal.launch.rank_entry", "-m", "hal.trainer.loop", "--config", os.path.abspath(args.config)]
    for k in _OVERRIDES:
        v = getattr(args, k, None)
        if v is not None:
            cmd += [f"--{k.replace('_', '-')}", str(os.path.abspath(v) if k == "run_dir" else v)]
    env = {**env, "HAL_LAUNCHER_PID": str(os.getpid())}
    emulated = all(e for _, e in chips)
    on = (f"node {node.node_rank} of {node.nnodes} (endpoint {node.addr}:{node.port}, {node.source})"
          if node.multi else "this machine")
    print(f"hal train: launching {nproc} ranks on {on} through torchrun, chips {source}"
          + (": every chip EMULATED on this host's CPU" if emulated else ""), flush=True)
    t0 = time.perf_counter()
    try:
        code = run_ranks("hal train", cmd, env, log=str(ranks_log(cfg.run_dir, node.node_rank if node.multi else None)))
    finally:
        _remove_empty(elastic_dir)
    print(f"hal train: {'done' if code == 0 else f'FAILED (exit code {code})'} in {time.perf_counter() - t0:.0f} s")
    return code


def ranks_log(run_dir, node: Optional[int] = None) -> "os.PathLike":
    """This launch's log of the ranks' stderr: ranks.log for the first launch in the folder, then
    ranks.1.log, ranks.2.log, ... (a log is never overwritten by a later launch); on several nodes
    sharing the folder each node has its own: ranks-node1.log, ranks-node1.1.log, ..."""
    from pathlib import Path
    stem = "ranks" if node is None else f"ranks-node{node}"
    n = 0
    while True:
        p = Path(run_dir) / (f"{stem}.log" if n == 0 else f"{stem}.{n}.log")
        if not p.exists():
            return p
        n += 1


def _remove_empty(folder) -> None:
    """Remove torchrun's log folder when it holds no file (torchrun leaves empty per-attempt folders)."""
    import shutil
    if os.path.isdir(folder) and not any(files for _, _, files in os.walk(folder)):
        shutil.rmtree(folder, ignore_errors=True)


def _finished(cfg) -> bool:
    """The run folder already holds this run trained to its last step (a complete checkpoint there):
    resuming would train nothing (and --measure-parts would measure the parts again for no run), so say
    so, with the finished run's figures, and start nothing."""
    import json

    from hal.trainer.checkpoint import latest
    done = latest(cfg.checkpoint_dir) if cfg.checkpoint.enabled else None
    if done is None or done < cfg.last_step:
        return False
    try:
        s = json.loads((cfg.run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        s = {}
    pct = (lambda x: "n/a" if x is None else f"{x * 100:.1f}%")
    figures = (f": final validation loss {s['final_val_loss']:.4f} nats, efficiency {pct(s.get('efficiency'))}, "
               f"Plan.even {pct(s.get('even_efficiency'))} ({(cfg.run_dir / 'summary.json').resolve()})"
               if isinstance(s.get("final_val_loss"), (int, float)) else "")
    print(f"hal train: {cfg.run_dir.resolve()} already holds this run finished at step {done} of {cfg.last_step}"
          f"{figures}; "
          f"nothing to train. For a new run pass --run-dir DIR (or remove that folder); to train on, raise "
          f"--steps.", flush=True)
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hal train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))
