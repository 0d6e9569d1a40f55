"""Emulated chips: HAL_EMULATE parsing and its errors, rank mapping, dilation arithmetic (including
what EmulatedRuntime.synchronize sleeps, with the clock stubbed), and the emulated capability
matrix being exactly vendor-declared ∩ what the CPU fabric measurably does."""
from __future__ import annotations

import pytest

from hal.emulation import emulate as emulation

from hal.emulation import runtime
from hal.contract.capabilities import CapabilityMatrix
from hal.emulation.emulate import (chips_in_map, cpu_fabric_capabilities, dilation_for, emulated_capabilities,
                           emulated_chip_for_rank, emulated_ranks, parse_emulate_map)
from hal.contract.errors import ChipSelectionError


def test_parse_map_and_single_name():
    assert parse_emulate_map("cuda:2,ascend:2") == [("cuda", 2), ("ascend", 2)]
    assert parse_emulate_map(" cuda:1 , kunlun:3 ") == [("cuda", 1), ("kunlun", 3)]
    assert parse_emulate_map("ascend") == [("ascend", None)]
    assert chips_in_map("cuda:2,ascend:2") == ["cuda", "ascend"]


@pytest.mark.parametrize("text,expect", [
    ("", r"HAL_EMULATE='' names no chip"),
    (" , ", r"names no chip"),
    ("cuda:0", r"item 'cuda:0': count must be >= 1"),
    ("cuda:-1", r"item 'cuda:-1' is not 'chip' or 'chip:count'"),
    ("CUDA:2", r"item 'CUDA:2' is not 'chip' or 'chip:count'"),
    ("cuda:two", r"item 'cuda:two'"),
    ("cuda:2,ascend", r"with several chips every item needs a count"),
])
def test_parse_errors_name_the_item(text, expect):
    with pytest.raises(ChipSelectionError, match=expect):
        parse_emulate_map(text)


def test_ranks_follow_torchrun_order():
    assert emulated_ranks("cuda:2,ascend:2") == ["cuda", "cuda", "ascend", "ascend"]
    assert [emulated_chip_for_rank("cuda:1,ascend:2,kunlun:1", r) for r in range(4)] == \
        ["cuda", "ascend", "ascend", "kunlun"]
    assert emulated_ranks("ascend") is None           # a single name: every rank, any world size
    assert emulated_chip_for_rank("ascend", 1000, 2048) == "ascend"


def test_world_size_mismatch_and_rank_outside_map():
    with pytest.raises(ChipSelectionError, match=r"maps 4 ranks but WORLD_SIZE is 8"):
        emulated_ranks("cuda:2,ascend:2", 8)
    with pytest.raises(ChipSelectionError, match=r"maps ranks 0..3; rank 4 is outside it"):
        emulated_chip_for_rank("cuda:2,ascend:2", 4)


@pytest.mark.parametrize("chip,peers,expected", [
    (989.5e12, [989.5e12, 353.8944e12], 1.0),                  # the fastest chip is not slowed
    (353.8944e12, [989.5e12, 353.8944e12], 989.5e12 / 353.8944e12),
    (148e12, [148e12, 989.5e12, 294.912e12], 989.5e12 / 148e12),
    (None, [989.5e12], 1.0),                                   # unknown own peak: no dilation
    (100e12, [None, None], 1.0),                               # no known peer: no dilation
    (100e12, [None, 300e12], 3.0),
])
def test_dilation_for(chip, peers, expected):
    assert dilation_for(chip, peers) == pytest.approx(expected)


def test_emulated_runtime_sleeps_dilation_minus_one_times_cpu_time(monkeypatch):
    clock = iter([10.0, 12.5, 12.5])      # process_time: at init, at synchronize, after the sleep
    slept = []
    monkeypatch.setattr(runtime.time, "process_time", lambda: next(clock))
    monkeypatch.setattr(runtime.time, "sleep", slept.append)
    rt = runtime.EmulatedRuntime("ascend", dilation=2.8)
    rt.synchronize()
    assert slept == [pytest.approx(2.5 * 1.8)]


def test_emulated_runtime_without_dilation_never_sleeps(monkeypatch):
    monkeypatch.setattr(runtime.time, "sleep", lambda s: pytest.fail(f"slept {s}"))
    rt = runtime.EmulatedRuntime("cuda")
    rt.synchronize()
    assert rt.device().type == "cpu"


def test_emulated_runtime_refuses_speedup():
    with pytest.raises(ValueError, match=r"chip 'cuda' must be >= 1, got 0.5"):
        runtime.EmulatedRuntime("cuda", dilation=0.5)


def test_emulated_capabilities_are_the_intersection():
    fabric = cpu_fabric_capabilities("gloo")
    assert fabric.entries, "the measured gloo matrix is empty"
    vendor = CapabilityMatrix.build("ascend", "test: vendor declares everything")
    emu = emulated_capabilities(vendor)
    assert emu.entries == vendor.entries & fabric.entries == fabric.entries
    assert emu.chip == "ascend" and "emulated" in emu.source
    # A vendor that lacks something the fabric has: the emulated chip lacks it too.
    narrow = CapabilityMatrix.build("kunlun", "test: no all_to_all", exclude=[("all_to_all", "*", "*")])
    emu2 = emulated_capabilities(narrow)
    assert not any(c == "all_to_all" for c, _, _ in emu2.entries)
    assert emu2.entries == narrow.entries & fabric.entries
    # And something the fabric cannot do natively is not claimed even if the vendor declares it
    # (gloo refuses PREMUL_SUM, see the measured data file).
    assert not fabric.supports("all_reduce", "float32", "premul_sum")
    assert not emu.supports("all_reduce", "float32", "premul_sum")


def test_cpu_fabric_choice(monkeypatch):
    monkeypatch.setenv("HAL_CPU_CCL", "mpi")
    with pytest.raises(ChipSelectionError, match=r"HAL_CPU_CCL='mpi': expected 'gloo' or 'shm'"):
        emulation.cpu_ccl()
    monkeypatch.setenv("HAL_CPU_CCL", "")
    assert emulation.cpu_ccl() == "auto"  # shm on one host, gloo across hosts (tests/test_shm.py)
