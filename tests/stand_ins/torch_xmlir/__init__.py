"""Stand-in for KunlunXin's torch_xmlir: importable means "KunlunXin's PyTorch build", which is how
baidu-baige/sglang-kunlun (sglang_kunlun/platform/srt.py `activate`) recognises a Kunlun machine.

Only what hal_kunlun touches: `__version__` and `xpu.get_device_name(index)` (the device API of
torch_xmlir/xpu/device.py as a public analysis of the package describes it: a thin wrapper over
`_XMLIRC._xpu_get_device_properties(d).name`). Tests set `xpu.NAMES` and read `xpu.CALLS`.
"""
from . import xpu  # noqa: F401

__version__ = "stand-in"
