"""`hal train`: train one model across a (mixed) cluster from a TOML config - config (hal.trainer.config),
offline byte-level data (hal.trainer.data), the Trainer and its components (hal.trainer.trainer), the rank
entry torchrun runs (hal.trainer.loop) and the command line (`hal train`: hal/cli/train.py; the flags both
sides share: hal.trainer.args). Layering: trainer imports strategies, ccl_bridge and hal; only hal/cli/
imports trainer."""
