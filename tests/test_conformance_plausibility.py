"""Profile plausibility ranges (contract.PLAUSIBLE) against every catalogued chip model, and the
refusal tables of ops.refusals.<op> against the HAL reference (tiny, CPU only)."""
import pytest

import hal
from hal.conformance.levels.contract import PLAUSIBLE, implausible
from hal.conformance.levels.ops_refusals import REFUSALS, Refusal, verdict
from hal.core import catalog
from hal.ops.reference import KERNELS


@pytest.mark.parametrize("chip", catalog.chips())
def test_every_catalogued_profile_is_plausible(chip):
    for key, prof in catalog.profiles(chip).items():
        assert implausible(prof) == [], f"{chip}/{key}"


def test_cpu_profile_is_plausible():
    from hal_cpu.profile import cpu_profile
    assert implausible(cpu_profile()) == []


@pytest.mark.parametrize("field,value", [("nic_bandwidth", 400e9), ("intra_node_bandwidth", 450e9 * 8),
                                         ("memory_bandwidth", 3.35e12 * 1e3), ("memory_bytes", 80.0),
                                         ("memory_bytes", 80e9 * 2 ** 30)])
def test_unit_slips_fall_outside(field, value):
    prof = catalog.get("cuda", "H100")
    unit = "B" if field == "memory_bytes" else "B/s"
    bad = prof.model_copy(update={field: hal.Figure(value=value, unit=unit, source="test")})
    problems = implausible(bad)
    assert len(problems) == 1 and problems[0].startswith(field) and field in PLAUSIBLE
    assert f"{value:g}" in problems[0] and unit in problems[0]


def test_tflops_as_flops_falls_outside():
    prof = catalog.get("cuda", "H100")
    bad = prof.model_copy(update={"peak_flops": {"bfloat16": hal.Figure(value=989.0, unit="FLOP/s", source="t")}})
    assert "peak_flops[bfloat16]" in implausible(bad)[0]


def test_every_op_has_a_refusal_table_with_a_raising_case():
    assert set(REFUSALS) == set(KERNELS)
    for op, cases in REFUSALS.items():
        assert cases and len({c.name for c in cases}) == len(cases), op


@pytest.mark.parametrize("op", sorted(REFUSALS))
def test_reference_agrees_with_itself(op):
    for case in REFUSALS[op]:
        assert verdict(KERNELS[op], op, case, "cpu") is None, (op, case.name)


def test_a_kernel_that_returns_where_the_reference_raises_is_named():
    case = next(c for c in REFUSALS["embedding"] if c.name == "id_eq_vocab")
    why = verdict(lambda ids, w: w[ids.clamp(0, w.shape[0] - 1)], "embedding", case, "cpu")
    assert why and "instead of raising" in why


def test_a_kernel_that_raises_where_the_reference_returns_is_named():
    case = Refusal("in_range", lambda g: ((hal.ops.reference.torch.tensor([0, 1]),
                                           hal.ops.reference.torch.ones(3, 2)), {}))
    def refuse(ids, weight):
        raise RuntimeError("no")
    assert "raised RuntimeError" in verdict(refuse, "embedding", case, "cpu")
    either = Refusal("in_range", case.make, either=True)
    assert verdict(refuse, "embedding", either, "cpu") is None
