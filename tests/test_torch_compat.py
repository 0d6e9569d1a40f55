"""hal.contract.compat (the torch APIs that moved since the floor, 2.5) and each plugin's one-line
refusal of a torch its vendor stack does not ship. In process; the oldest-torch lane itself is
scripts/oldest_torch.sh (docs/writing-a-plugin.md says what it runs and what it costs)."""
import importlib

import pytest
import torch

from hal.contract import compat

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
