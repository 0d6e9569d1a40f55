"""`hal train`: train one model across a (mixed) cluster from a TOML config - config (trainer.config),
offline byte-level data (trainer.data), the training loop run under torchrun (trainer.loop) and the
command line (`hal train`: commands/train.py; the flags both sides share: trainer.args). Layering:
trainer imports strategies, ccl_bridge and hal; only commands/ imports trainer."""
