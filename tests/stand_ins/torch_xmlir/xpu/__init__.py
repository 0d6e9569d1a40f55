"""Stand-in for torch_xmlir.xpu: device names as torch_xmlir reports them."""
from __future__ import annotations

NAMES: list[str] = ["P800"]
CALLS: list[tuple] = []


def get_device_name(device=None) -> str:
    CALLS.append(("get_device_name", device))
    index = 0 if device is None else int(device)
    return NAMES[index % len(NAMES)]
