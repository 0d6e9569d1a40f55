"""`hal train`: train one model across a (mixed) cluster from a TOML config - config (trainer.config),
offline byte-level data (trainer.data), the training loop run under torchrun (trainer.loop) and the
command line (trainer.cli). Layering: trainer imports strategies, ccl_bridge and hal; nothing imports
trainer."""
