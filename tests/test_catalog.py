"""The chip catalog: every entry validates, every known figure has a source, lookups by key, alias
and reported device name, defaults, and refusals of malformed catalog data."""
from __future__ import annotations

import pytest

from hal.core import catalog
from hal.core.catalog import CatalogError, UnknownModelError, load_catalog_text
from hal.contract.chips import ChipProfile
from hal.contract.errors import UnknownChipError

EXPECTED = {"cuda": {"A100", "H100", "H800", "H20"}, "ascend": {"910A", "910B1", "910B2", "910B3", "910B4"},
            "kunlun": {"R200", "P800"}}


def test_catalogued_chips_and_models():
    assert catalog.chips() == sorted(EXPECTED)
    for chip, models in EXPECTED.items():
        profs = catalog.profiles(chip)
        assert set(profs) == models
        assert all(isinstance(p, ChipProfile) and p.chip == chip for p in profs.values())


def test_every_known_figure_has_a_source_and_every_unknown_a_note():
    for chip in EXPECTED:
        for key, prof in catalog.profiles(chip).items():
            figures = dict(prof.peak_flops, memory_bytes=prof.memory_bytes,
                           memory_bandwidth=prof.memory_bandwidth,
                           intra_node_bandwidth=prof.intra_node_bandwidth, nic_bandwidth=prof.nic_bandwidth)
            for name, fig in figures.items():
                if fig.known:
                    assert fig.source and ("http" in fig.source or "arXiv" in fig.source), (chip, key, name)
                    assert fig.value > 0
                else:
                    assert fig.note, f"{chip}/{key}/{name} is unknown without a note"


def test_sparse_figures_are_halved_to_dense():
    h100 = catalog.get("cuda", "H100")
    assert h100.peak("bfloat16") == pytest.approx(1979e12 / 2)
    assert "halved" in h100.peak_flops["bfloat16"].note and "sparsity" in h100.peak_flops["bfloat16"].source
    assert h100.peak("float8") == pytest.approx(3958e12 / 2)
    # per-direction bandwidth: NVLink 900 GB/s bidirectional -> 450e9
    assert h100.intra_node_bandwidth.value == pytest.approx(450e9)


def test_key_alias_and_device_name_lookups():
    assert catalog.get("cuda", "h800").model.startswith("NVIDIA H800")
    assert catalog.get("cuda", "H800-SXM5") is catalog.get("cuda", "H800")
    assert catalog.get("ascend", "Ascend910B3").model == "Huawei Ascend 910B3"
    assert catalog.get("cuda", "NVIDIA A100-SXM4-80GB") is catalog.get("cuda", "A100")   # via match()


@pytest.mark.parametrize("chip,name,key", [
    ("cuda", "NVIDIA H800", "H800"),
    ("cuda", "NVIDIA H100 80GB HBM3", "H100"),
    ("cuda", "NVIDIA H20", "H20"),
    ("cuda", "NVIDIA A100-SXM4-80GB", "A100"),
    ("ascend", "Ascend910B2C", "910B2"),
    ("ascend", "Ascend910B1", "910B1"),
    ("kunlun", "P800 OAM", "P800"),
])
def test_match_reported_device_names(chip, name, key):
    assert catalog.match(chip, name) is catalog.profiles(chip)[key]


@pytest.mark.parametrize("chip,name", [
    ("cuda", "NVIDIA H100 PCIe"), ("cuda", "NVIDIA H200"), ("cuda", "NVIDIA H800 PCIe"),
    ("cuda", "NVIDIA A100-PCIE-40GB"), ("cuda", "Tesla V100-SXM2-32GB"), ("ascend", "Ascend910B"),
    ("ascend", "Ascend910B21"), ("cuda", ""),
])
def test_match_returns_none_for_unknown_names(chip, name):
    assert catalog.match(chip, name) is None


def test_defaults():
    assert catalog.default("cuda") is catalog.profiles("cuda")["H100"]
    assert catalog.default("ascend") is catalog.profiles("ascend")["910B2"]
    assert catalog.default("kunlun") is catalog.profiles("kunlun")["P800"]
    assert catalog.default_key("ascend") == "910B2"


def test_unknown_model_names_the_known_models():
    with pytest.raises(UnknownModelError) as info:
        catalog.get("cuda", "V100")
    msg = str(info.value)
    assert "'V100'" in msg and all(k in msg for k in EXPECTED["cuda"])
    assert isinstance(info.value, UnknownChipError) and isinstance(info.value, LookupError)


def test_unknown_chip_names_the_catalogued_chips():
    with pytest.raises(UnknownChipError, match=r"'tpu'.*\['ascend', 'cuda', 'kunlun'\]"):
        catalog.profiles("tpu")
    with pytest.raises(UnknownChipError, match="cpu_profile"):
        catalog.default("cpu")


GOOD = '''
chip = "acme"
default = "A1"
[sources]
ds = "Acme A1 datasheet (https://acme.example/a1.pdf)"
[models.A1]
model = "Acme A1"
peak_flops.bfloat16 = { value = 1e12, src = "ds", where = "p. 2" }
memory_bytes = { value = 16e9, src = "ds" }
memory_bandwidth = { unknown = "not published" }
intra_node_bandwidth = { unknown = "not published" }
nic_bandwidth = { unknown = "not published" }
'''


def test_loader_accepts_a_well_formed_file():
    cat = load_catalog_text(GOOD, "acme.toml")
    prof = cat.entries["A1"].profile
    assert prof.peak("bfloat16") == 1e12 and "p. 2" in prof.peak_flops["bfloat16"].source


@pytest.mark.parametrize("edit,expect", [
    (('src = "ds", where = "p. 2"', 'src = "nope"'), r"models\.A1\.peak_flops\.bfloat16: src = 'nope' is not in \[sources\]"),
    (("peak_flops.bfloat16", "peak_flops.bf16"), r"unknown dtype key\(s\) \['bf16'\]"),
    (('nic_bandwidth = { unknown = "not published" }\n', ""), r"models\.A1\.nic_bandwidth: missing"),
    (('value = 16e9', 'value = -1'), r"models\.A1\.memory_bytes: value -1"),
    (('default = "A1"', 'default = "A2"'), r"default = 'A2' is not one of its models \['A1'\]"),
    (('model = "Acme A1"', 'model = "Acme A1"\nbogus = 1'), r"unknown field\(s\) \['bogus'\]"),
])
def test_loader_refuses_malformed_entries(edit, expect):
    with pytest.raises(CatalogError, match=expect) as info:
        load_catalog_text(GOOD.replace(*edit), "acme.toml")
    assert "acme.toml" in str(info.value)
