"""Launching ranks: the checks a launching command runs before torchrun starts (`check`) and the
module torchrun runs as each rank's entry (`rank_entry`)."""
