"""Broken plugin: the embedding override clamps token ids into the vocabulary instead of raising.

A "safe" gather (weight[ids.clamp(0, V - 1)]): every in-range id gives the right row, so the golden
cases pass, but after a tokenizer / vocabulary mismatch every id past the vocabulary silently reads
the last row and the model trains on garbage where the reference raises IndexError.
"""
import hal

from ._base import install

BUG = "embedding clamps out-of-range token ids instead of raising"
CAUGHT_BY = "ops.refusals.embedding"
LEVELS = ["ops"]
SELECT = ["ops.refusals.embedding", "ops.embedding.float32"]
STILL_PASSES = ["ops.embedding.float32"]
MESSAGE = ["id_eq_vocab", "instead of raising"]


def embedding(ids, weight):
    return weight[ids.clamp(0, weight.shape[0] - 1)]  # the bug: clamps instead of refusing


install(globals(), "bad_embedding_out_of_range", BUG,
        kernels=lambda: [hal.OpKernel("embedding", embedding, priority=10, name="clamped_embedding")])
