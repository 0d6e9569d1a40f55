"""hal/strategies/planner/op_profile.py: the op-by-op cost of a stage, counted on fake tensors, equals what
timed emulation's clock charges when the same stage really runs on this CPU (hal.emulation.timed, a
non-sleeping clock), for the forward, the first backward, a later (accumulating) backward and the
AdamW step; and it is not what the totals model says on such small layers.
Single process; nothing sleeps."""
import pytest
import torch

from hal.emulation import timed
from hal.strategies.apply import StageModule
from hal.strategies.models import ModelConfig, build_model
from hal.strategies.models.data import lm_loss_sum
from hal.strategies.planner.op_profile import OpProfile, stage_seconds

CFG = ModelConfig(name="p", layers=4, hidden=64, heads=4, ffn=128, vocab=256, seq=32)


@pytest.mark.parametrize("layers,first,last,rows", [((2, 4), False, True, 2), ((0, 2), True, False, 3),
                                                   ((1, 3), False, False, 2)])
def test_profile_equals_what_the_clock_charges(layers, first, last, rows):
    # every op at the bfloat16 rate, as the profile prices it (the stage runs float32; the 910B2 has no float32 figure)
    speeds = timed.chip_speeds("ascend", "bfloat16", 2e5, charge_as={"*": "bfloat16"})
    st = StageModule(build_model(CFG, 0), layers, first, last)
    x = torch.randint(0, CFG.vocab, (rows, CFG.seq)) if first else torch.randn(rows, CFG.seq, CFG.hidden).requires_grad_()
    y = torch.randint(0, CFG.vocab, (rows, CFG.seq))
    opt = torch.optim.AdamW(st.parameters(), lr=1e-4, foreach=False)

    def fwd():
        out = st(x)
        return lm_loss_sum(out, y) / 100.0 if last else out

    clock = timed.VirtualClock("ascend", speeds, sleep=lambda s: None)

    def charged(fn):
        clock.reset_stats()
        with timed.timed(clock):
            r = fn()
        return clock.stats()["busy_s"], r

    t_f, out = charged(fwd)
    t_b1, _ = charged(lambda: out.backward(torch.ones_like(out)) if not last else out.backward())
    t_opt, _ = charged(opt.step)        # first step creates the moments (not what a later step costs)
    t_opt, _ = charged(opt.step)
    _, out = charged(fwd)
    t_b2, _ = charged(lambda: out.backward(torch.ones_like(out)) if not last else out.backward())
    prof = OpProfile(CFG)
    pf, pb, popt, acc = stage_seconds(prof, speeds.flops_per_s, speeds.bytes_per_s, 1, layers[1] - layers[0],
                                      first, last, rows, False, speeds.matrix)
    assert pf == pytest.approx(t_f, rel=0.02)
    assert pb == pytest.approx(t_b1, rel=0.02)
    assert pb + acc == pytest.approx(t_b2, rel=0.02)
    assert popt == pytest.approx(t_opt, rel=0.02)
    assert acc > 0


def test_profile_prices_more_than_the_totals_model_on_small_layers():
    """Tiny layers are memory-bound op by op: the roofline per op is well above FLOPs / F."""
    from hal.core.topology import Topology
    from hal.strategies.planner.cost import ModelFacts, replica_cost
    from hal.strategies.planner.facts import emulated_chip_facts
    topo = Topology.from_chips(["ascend"])
    (f,) = emulated_chip_facts(topo, 2e5, 1e9, 1e-4)
    by_ops = replica_cost(ModelFacts(CFG, dtype_bytes=4, op_profile=OpProfile(CFG)), f, 1, 2, False, False, 2,
                          False, 0, 1, 1)
    totals = replica_cost(ModelFacts(CFG, dtype_bytes=4), f, 1, 2, False, False, 2, False, 0, 1, 1)
    assert by_ops.fwd > 1.5 * totals.fwd
