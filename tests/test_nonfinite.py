"""Non-finite training (hal/trainer/nonfinite.py, `[train] on_nonfinite`), in process: `first_nonfinite`
names the first bad tensor (value or gradient), and the guard's stop / skip / limit decisions (the ranks'
agreement replaced by a stub). End to end (2 ranks, emulated, a NaN gradient injected by the test-only
`[debug]` fault `nan_grad`), both modes ride on tests/test_checkpoint_integrity.py's warm worker pool: a
`hal train` launch per mode would cost a whole torchrun start-up each, over the suite's time budget;
`checkpoints_finite` below is the check that no checkpoint holds a NaN.
"""
from __future__ import annotations

from pathlib import Path

import torch

from hal.trainer.nonfinite import first_nonfinite


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
