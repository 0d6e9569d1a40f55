"""What `hal bench comm` measures: the harness (sizes, slowest-rank medians, busbw, the table) and
the collective measurement over torch.distributed. The scripts in the repository's benchmarks/
folder import these; they are not installed."""
