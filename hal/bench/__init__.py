"""What `hal bench comm` measures: the harness (sizes, slowest-rank medians, busbw, the table) and
the collective measurement over torch.distributed. The scripts in the repository's benchmarks/
folder import these; they are not installed."""

# What `hal bench comm` measures, named here without importing torch (its --help lists them).
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce")
BACKENDS = ("gloo", "hetero", "shm", "vendor")
DTYPES = ("float32", "float16", "bfloat16", "float64", "int8", "uint8", "int32", "int64")  # hal's names
