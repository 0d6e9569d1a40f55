"""ccl_bridge: the `hetero` torch.distributed backend that links sub-clusters of different chips."""
