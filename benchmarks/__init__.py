"""benchmarks: measurements that print figures, never pass/fail (docs/performance.md records them).

`harness` is the one harness they share (sizes, median of the slowest rank, nccl-tests bus bandwidth
from `hal.efficiency`, the table); `comm` measures collectives over torch.distributed and is what
`hal bench comm` runs. The other modules are scripts: `python -m benchmarks.NAME --help`.
"""
