"""Stand-in for torch_npu._C (the compiled extension): only the distributed part the plugin uses."""
from . import _distributed_c10d  # noqa: F401
