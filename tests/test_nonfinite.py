"""Non-finite training (hal/trainer/nonfinite.py, `[train] on_nonfinite`).

End to end, one `hal train` launch (2 ranks, cuda:1 + ascend:1, every chip EMULATED on this CPU, DP 2 over
gloo, 4 steps, a checkpoint every step): a NaN gradient injected by the test-only `[debug]` fault
`nan_grad` (rank 1, after the backward of step 3) stops the run (the default, `stop`) with one console
line naming the step, the rank and the parameter, and no checkpoint holds a NaN. The `skip` mode end to end
(skipped on every rank, counted in metrics.jsonl and summary.json, no NaN checkpoint) rides on
tests/test_checkpoint_integrity.py's reference run, whose ranks are already up (a second launch here would
cost a whole torchrun start-up). In process: `first_nonfinite` names the first bad tensor, and the guard's
stop / skip / limit decisions (the ranks' agreement replaced by a stub).
"""
from __future__ import annotations

from pathlib import Path

import torch

from hal.trainer.nonfinite import first_nonfinite

from ._hal_train_job import run_hal_train

ROOT = Path(__file__).resolve().parent.parent
JOB_LIMIT_S = 300


def test_first_nonfinite_names_the_first_bad_tensor():
    a, b, c = (torch.nn.Parameter(torch.ones(3)) for _ in range(3))
    named = [("a", a), ("b", b), ("c", c)]
    assert first_nonfinite(named, grads=False) is None and first_nonfinite(named, grads=True) is None
    b.grad, c.grad = torch.tensor([1.0, float("inf"), 0.0]), torch.full((3,), float("nan"))
    assert first_nonfinite(named, grads=True) == "b" and first_nonfinite(named, grads=False) is None
    with torch.no_grad():
        c[0] = float("nan")
    assert first_nonfinite(named, grads=False) == "c"


def test_guard_stops_skips_and_counts(monkeypatch):
    import pytest

    from hal.trainer import nonfinite
    from hal.trainer.config import TrainSection
    monkeypatch.setattr(nonfinite, "agree", lambda name, group: None if name is None else (1, name))
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.tensor([0.0, float("nan")])
    named = [("blocks.0.attn.wq.weight", p)]
    stop = nonfinite.NonFiniteGuard(TrainSection(), 0, None)
    with pytest.raises(nonfinite.NonFiniteError, match=r"step 7: non-finite gradient on rank 1: first non-finite "
                       r"parameter blocks\.0\.attn\.wq\.weight \(loss 2\.5, grad norm nan\)"):
        stop.check(7, 2.5, float("nan"), named)
    skip = nonfinite.NonFiniteGuard(TrainSection(on_nonfinite="skip", max_skipped=1), 0, None)
    assert skip.check(3, 2.5, 1.0, named) is True and skip.skipped == 1
    assert skip.check(4, 2.5, 1.0, [("x", torch.nn.Parameter(torch.ones(1)))]) is False
    with pytest.raises(nonfinite.NonFiniteError, match="2 steps skipped, more than train.max_skipped = 1"):
        skip.check(5, float("inf"), 1.0, [])


def _config(tmp_path: Path, mode: str) -> Path:
    path = tmp_path / f"{mode}.toml"
    path.write_text(f"""
seed = 3
steps = 4
global_batch = 4
backend = "gloo"
timeout_s = 30
[model]
path = "{ROOT / 'examples/models/tiny.toml'}"
overrides = {{ vocab = 256, seq = 16 }}
[data]
max_bytes = 262144
[optimizer]
warmup_steps = 1
[cluster]
emulate = "cuda:1,ascend:1"
[checkpoint]
interval = 1
[log]
dir = "{tmp_path / mode}"
val_interval = 0
val_batches = 1
print_interval = 1
[[debug.faults]]
action = "nan_grad"
rank = 1
step = 3
""")
    return path


def checkpoints_finite(run_dir: Path) -> list[int]:
    """Steps of the checkpoints under run_dir (each read whole, offline); asserts every tensor is finite."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    steps = []
    for step in sorted((run_dir / "checkpoints").glob("step_*")):
        if not (step / ".metadata").is_file():
            continue
        dcp_to_torch_save(str(step), str(step.parent / "offline.pt"))
        state = torch.load(step.parent / "offline.pt", weights_only=False)
        bad = [k for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
               and not bool(torch.isfinite(v).all())]
        assert not bad, f"{step}: non-finite entries {bad[:3]}"
        steps.append(int(step.name[5:]))
    return steps


def test_nan_gradient_stops_the_run_naming_step_rank_parameter(tmp_path):
    job = run_hal_train(_config(tmp_path, "stop"), 0, JOB_LIMIT_S, HAL_CPU_CCL="gloo")
    assert job.returncode == 1, job.stdout[-3000:]
    lines = [ln for ln in job.stdout.splitlines() if "hal train: error: first failing rank" in ln]
    assert len(lines) == 1, job.stdout[-3000:]
    assert ("NonFiniteError: step 3: non-finite gradient on rank 1: first non-finite parameter embed.weight"
            in lines[0]), lines[0]
    assert max(checkpoints_finite(tmp_path / "stop")) <= 2
