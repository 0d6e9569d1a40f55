"""strategies: parallel strategies (DP, sharded DP, TP, PP, EP) written only against hal and torch.distributed."""
