"""hal.contract.compat (the torch APIs that moved since the floor, 2.5) and each plugin's one-line
refusal of a torch its vendor stack does not ship. In process; the oldest-torch lane itself is
scripts/oldest_torch.sh (docs/writing-a-plugin.md says what it runs and what it costs)."""
import importlib
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from hal.contract import compat
from hal.emulation import gloo_fallback
from hal.emulation.gloo_group import StridedSafeGloo

# the packages re-export their `probe` function under the submodule's name: take the modules
ascend_probe = importlib.import_module("hal_ascend.probe")
cuda_probe = importlib.import_module("hal_cuda.probe")


def test_versions_parse_as_torch_writes_them():
    assert compat.parse_version("2.5.1+cpu") == (2, 5, 1)
    assert compat.parse_version("2.13.0a0+git1234") == (2, 13, 0)
    assert compat.parse_version("2.6") == (2, 6, 0)
    with pytest.raises(ValueError, match="not a version"):
        compat.parse_version("nightly")


def test_torch_problem_names_the_version_the_range_and_the_source():
    assert compat.torch_problem("x", (2, 5), version="2.5.1") is None
    assert compat.torch_problem("x", (2, 5), (2, 6), version="2.5.9") is None
    msg = compat.torch_problem("the KunlunXin stack", (2, 5), (2, 6), source="vendor docs", version="2.13.0")
    assert msg == "torch 2.13.0 is not supported by the KunlunXin stack (supported: torch >= 2.5, < 2.6; vendor docs)"
    assert "torch 2.4.1 is not supported by the HAL (supported: torch >= 2.5" in compat.torch_problem(
        "the HAL", compat.TORCH_FLOOR, version="2.4.1")


def test_moved_apis_resolve_on_this_torch():
    fsdp = compat.fsdp()
    assert callable(fsdp.fully_shard) and hasattr(fsdp, "MixedPrecisionPolicy") and hasattr(fsdp, "FSDPModule")
    assert compat.dtensor().DTensor is torch.distributed.tensor.DTensor
    assert compat.current_accelerator_type() in (None, "cuda", "xpu", "npu", "mps")
    compat.check_torch_floor()  # this torch is above the floor: no error


def test_ascend_refuses_a_torch_npu_built_for_another_torch():
    assert ascend_probe.torch_pairing_problem("2.5.1.post2", "2.5.1") is None
    assert ascend_probe.torch_pairing_problem("2.5.1rc1", "2.5.1+cpu") is None
    msg = ascend_probe.torch_pairing_problem("2.5.1", "2.13.0")
    assert msg.startswith("torch_npu 2.5.1 is built for torch 2.5.1, but torch is 2.13.0") and "\n" not in msg
    assert "not supported by hal_ascend" in ascend_probe.torch_pairing_problem("2.4.0", "2.4.0")


def test_cuda_on_a_cpu_build_of_torch_says_so(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    found = cuda_probe.probe()
    assert not found["native"] and "was built without CUDA (a CPU build)" in found["reason"]
    monkeypatch.setattr(torch, "__version__", "2.4.1")
    assert "torch 2.4.1 is not supported by hal_cuda" in cuda_probe.probe()["reason"]


def test_premul_sum_carries_its_factor_on_this_torch():
    for factor in (0.25, torch.tensor([0.5])):
        op = compat.premul_sum(factor)
        assert op.op == dist.ReduceOp.PREMUL_SUM
        assert float(compat.premul_factor(op)) == float(factor)
    assert compat.premul_factor(dist.ReduceOp(dist.ReduceOp.SUM)) is None


@pytest.fixture
def backend_registry(monkeypatch):
    """torch's backend tables as copies, so registrations here leave the process as it was."""
    B = dist.Backend
    for name in ("default_device_backend_map", "backend_list", "backend_type_map", "backend_capability", "_plugins"):
        monkeypatch.setattr(B, name, type(getattr(B, name))(getattr(B, name)))
    yield B
    if hasattr(B, "HALCOMPAT"):
        delattr(B, "HALCOMPAT")


def test_register_backend_twice_and_a_built_in_name(backend_registry):
    B = backend_registry
    first, second = (lambda *a: "first"), (lambda *a: "second")
    B.default_device_backend_map["xpu"] = "xccl"  # a device type another backend already serves
    compat.register_backend("halcompat", first, devices=["cpu", "xpu"])
    compat.register_backend("halcompat", second, extended_api=True, devices=["cpu", "xpu"])  # 2.5 asserted here
    assert B._plugins["HALCOMPAT"].creator_fn is second and B._plugins["HALCOMPAT"].extended_api
    assert B.backend_list.count("halcompat") == 1 and B.HALCOMPAT == "halcompat"
    assert B.default_device_backend_map["xpu"] == "xccl" and B.default_device_backend_map["cpu"] == "gloo"
    compat.register_backend("gloo", first, devices=["cpu"])  # a name torch builds in (2.5: "GLOO ... already exist")
    assert B._plugins["GLOO"].creator_fn is first and B.GLOO == "gloo" and B.backend_list.count("gloo") == 1


def test_rms_norm_kernel_accumulates_16_bit_inputs_wide_on_this_torch():
    """torch 2.5's own rms_norm squares float16 in float16 (300^2 overflows): the torch kernel upcasts there."""
    from hal.ops import torch_kernels
    x = torch.full((1, 4), 300.0, dtype=torch.float16)
    measured = {(2, 5): False, (2, 13): True}.get(compat.torch_version()[:2])  # the two torches measured
    assert measured is None or compat.rms_norm_accumulates_wide() is measured
    assert torch_kernels.rms_norm(x, torch.ones(4, dtype=torch.float16)).tolist() == [[1.0] * 4]


def test_gloo_matrix_is_the_one_measured_on_a_torch_no_newer():
    assert compat.gloo_measured_file("2.5.1+cu124") == "gloo_capabilities_torch2.5.json"
    assert compat.gloo_measured_file("2.9.0") == "gloo_capabilities_torch2.5.json"  # unmeasured: the older one
    assert compat.gloo_measured_file("2.13.0+cpu") == "gloo_capabilities.json"
    assert compat.gloo_measured_file("2.14.1") == "gloo_capabilities.json"


def _opts(cls, **fields):
    o = cls()
    for k, v in fields.items():
        setattr(o, k, v)
    return o


def _two_ranks(fn):
    """fn(pg) on both ranks of a 2-rank HAL gloo group in this process (one thread per rank)."""
    store = dist.HashStore()
    with ThreadPoolExecutor(2) as ex:
        pgs = list(ex.map(lambda r: StridedSafeGloo(store, r, 2, timedelta(seconds=30)), range(2)))
        return list(ex.map(fn, pgs))


def test_gloo_fallbacks_give_what_gloo_gives():
    """Each fallback forced (as on torch 2.5, where gloo lacks the op), on 2 ranks, against exact results;
    then the same calls through the group, which on this torch runs gloo or the fallback."""
    fb = gloo_fallback.FALLBACKS

    def case(pg):
        r, out = pg.rank(), {}
        x = torch.arange(6.0).view(2, 3) + 10 * r  # rank 0: 0..5, rank 1: 10..15
        for how, call in (("fallback", lambda name, *a: fb[name](pg, *a)),
                          ("group", lambda name, *a: getattr(pg, name)(*a))):
            y = x.clone()
            call("allreduce", [y], _opts(dist.AllreduceOptions, reduceOp=dist.ReduceOp.AVG)).wait()
            z = x.clone()[:, 1]  # strided
            call("reduce", [z], _opts(dist.ReduceOptions, reduceOp=dist.ReduceOp.AVG, rootRank=1)).wait()
            rs = torch.empty(3)
            call("reduce_scatter", [rs], [list(x.clone())], _opts(dist.ReduceScatterOptions,
                                                                    reduceOp=dist.ReduceOp.MAX)).wait()
            rst = torch.empty(2, dtype=torch.int32)
            call("_reduce_scatter_base", rst, torch.tensor([1, 2, 4, 8], dtype=torch.int32) << r,
                 _opts(dist.ReduceScatterOptions, reduceOp=dist.ReduceOp.BOR)).wait()
            a2a = [torch.empty(2) for _ in range(2)]
            call("alltoall", a2a, [torch.full((2,), 10.0 * r + i) for i in range(2)], dist.AllToAllOptions()).wait()
            out[how] = (y.tolist(), z.tolist(), rs.tolist(), rst.tolist(), [t.tolist() for t in a2a])
        w = torch.full((2,), 1.0 + r)  # a fallback's future completes after its finishing step
        got = fb["allreduce"](pg, [w], _opts(dist.AllreduceOptions, reduceOp=dist.ReduceOp.AVG)).get_future().wait()
        out["future"] = got[0] is w and w.tolist()
        return out

    r0, r1 = _two_ranks(case)
    assert r1["fallback"] == r1["group"]
    assert [v for i, v in enumerate(r0["fallback"]) if i != 1] == [v for i, v in enumerate(r0["group"]) if i != 1]
    avg = [[5.0, 6.0, 7.0], [8.0, 9.0, 10.0]]
    assert r0["fallback"][0] == r1["fallback"][0] == avg
    assert r1["fallback"][1] == [6.0, 9.0]  # the root's; gloo leaves the others' buffers undefined
    assert r0["fallback"][2] == [10.0, 11.0, 12.0] and r1["fallback"][2] == [13.0, 14.0, 15.0]
    assert r0["fallback"][3] == [1 | 2, 2 | 4] and r1["fallback"][3] == [4 | 8, 8 | 16]
    assert r0["fallback"][4] == [[0.0, 0.0], [10.0, 10.0]] and r1["fallback"][4] == [[1.0, 1.0], [11.0, 11.0]]
    assert r0["future"] == r1["future"] == [1.5, 1.5]
