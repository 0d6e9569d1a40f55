"""The training stream (hal/trainer/data.py Loader), in-process: packed `seq + 1`-token windows in a seeded
order that covers every window once per epoch; a rank gathers only the rows of the global batch it reads
(`read_rows`: stage-0 inputs, last-stage targets) and they equal the full batch's; a run stopped at step k
and resumed from the position its checkpoint recorded (data.json, through JSON) sees exactly the sequence ids
of an uninterrupted run, also under another global batch; a changed tokenizer or seq is refused naming
both values; the default (stdlib bytes) corpus is still what `hal train` reads."""
from __future__ import annotations

import json

import pytest
import torch

from hal.trainer.data import (Corpus, DataResumeError, Loader, load_position, read_rows, replica_rows,
                              save_position, train_batch, val_batches)
from hal.trainer.tokenizer import Tokenizer

SEQ, B = 4, 3


def _corpus(n: int = 61, fingerprint: str = "fp") -> Corpus:
    """A stream whose token at position i is i (mod 250): windows are recognisable by their first token."""
    stream = torch.arange(n) % 250
    return Corpus(stream, torch.arange(21) % 250, 1, "test", Tokenizer("t", 256, None, fingerprint), key="k")


def _flat_ids(loader: Loader, steps: range) -> list[tuple[int, int]]:
    out = []
    for s in steps:
        epochs, ids = loader.ids(s)
        out += list(zip(epochs.tolist(), ids.tolist()))
    return out


def test_packed_windows_cover_each_window_once_per_epoch():
    corpus = _corpus()
    loader = Loader(corpus, 5, B, SEQ)
    assert loader.windows == (61 - 1) // SEQ == 15
    seen = _flat_ids(loader, range(10))  # 30 samples = 2 epochs
    for e in (0, 1):
        assert sorted(i for ep, i in seen if ep == e) == list(range(15))  # each window once per epoch
    assert [i for ep, i in seen if ep == 0] != [i for ep, i in seen if ep == 1]  # reshuffled each epoch
    x, y = loader.batch(2)
    assert x.shape == y.shape == (B, SEQ) and x.dtype == torch.int64
    for row, w in zip(range(B), loader.ids(2)[1].tolist()):  # window w = tokens [w*seq, w*seq + seq + 1)
        assert x[row].tolist() == list(range(w * SEQ, w * SEQ + SEQ)) and y[row].tolist() == x[row].add(1).tolist()
    assert torch.equal(train_batch(corpus, 5, 2, B, SEQ)[0], x)  # the functional form is the same stream
    assert not torch.equal(Loader(corpus, 6, B, SEQ).ids(0)[1], loader.ids(0)[1])  # the seed orders it
    v1, v2 = val_batches(corpus, 5, 2, B, SEQ), val_batches(corpus, 5, 2, B, SEQ)
    assert len(v1) == 2 and all(torch.equal(a[0], b[0]) for a, b in zip(v1, v2))  # fixed held-out batches


def test_a_rank_gathers_only_the_rows_it_reads():
    from hal.core.topology import Topology
    from hal.strategies.models import ModelConfig
    from hal.strategies.plan import Plan
    topo = Topology.from_env({"HAL_EMULATE": "cuda:3,ascend:1"})
    cfg = ModelConfig(name="t", layers=2, hidden=32, heads=4, ffn=64, vocab=256, seq=SEQ)
    plan = Plan.weighted(topo, cfg, 8, {"cuda": 3.0, "ascend": 1.0}, num_microbatches=2)
    corpus = _corpus(400)
    full = Loader(corpus, 1, 8, SEQ).batch(3)
    covered = []
    for rank in plan.ranks:
        rows = read_rows(plan, rank)
        assert rows == replica_rows(plan, rank)  # one stage: the rows it reads are its replica's
        x, y = Loader(corpus, 1, 8, SEQ, rows).batch(3)
        mine = [r for lo, hi in rows for r in range(lo, hi)]
        covered += mine
        assert torch.equal(x[mine], full[0][mine]) and torch.equal(y[mine], full[1][mine])
        others = [r for r in range(8) if r not in mine]
        assert not x[others].any() and not y[others].any()  # never read: left zero
    assert sorted(covered) == list(range(8))
    pp = Plan.even(topo, cfg, 8, 2, pp=2)  # a 2-stage pipeline: every rank reads inputs or targets of its rows
    assert all(read_rows(pp, r) for r in pp.ranks)


def test_stop_and_resume_sees_the_same_sequence_ids(tmp_path):
    corpus = _corpus()
    uninterrupted = _flat_ids(Loader(corpus, 5, B, SEQ), range(12))
    first = Loader(corpus, 5, B, SEQ)
    before = _flat_ids(first, range(4))
    save_position(tmp_path / "step_00000004", first.state(4))  # what the trainer writes with the checkpoint
    saved = load_position(tmp_path / "step_00000004")
    assert saved == json.loads(json.dumps(first.state(4))) and saved["sequences"] == 12 and saved["tokens"] == 48
    assert load_position(tmp_path / "no_such_step") is None
    resumed = Loader(corpus, 5, B, SEQ)
    resumed.resume(saved, 4)
    assert before + _flat_ids(resumed, range(4, 12)) == uninterrupted
    # another global batch after the resume: it continues at the next unseen sequence of the same order
    wider = Loader(corpus, 5, 2 * B, SEQ)
    wider.resume(saved, 4)
    assert _flat_ids(wider, range(4, 8)) == uninterrupted[12:12 + 4 * 2 * B]
    assert wider.state(5)["sequences"] == 12 + 2 * B
    with pytest.raises(DataResumeError, match=r"tokenised by 't' \(fp\), this run's by 't' \(other\)"):
        Loader(_corpus(fingerprint="other"), 5, B, SEQ).resume(saved, 4)
    with pytest.raises(DataResumeError, match=r"seq = 4 tokens, this run's seq = 5"):
        Loader(corpus, 5, B, 5).resume(saved, 4)


def test_default_stdlib_bytes_corpus(tmp_path):
    from pathlib import Path

    from hal.trainer.config import TrainConfig
    root = Path(__file__).resolve().parent.parent
    cfg = TrainConfig(seed=3, steps=4, global_batch=8, optimizer={"warmup_steps": 1},
                      model={"path": str(root / "examples/models/tiny.toml")}, data={"max_bytes": 1 << 18},
                      log={"dir": str(tmp_path)})
    corpus = Corpus.from_config(cfg)
    assert corpus.vocab_size == 256 and corpus.tokenizer.eos_id is None and corpus.train.dtype == torch.uint8
    assert corpus.train.numel() + corpus.val.numel() == 1 << 18 and corpus.key and corpus.cache is None
    assert not (tmp_path / "data-cache").exists()  # bytes need no token cache
    x, y = train_batch(corpus, 3, 0, 8, 32)
    assert x.shape == (8, 32) and int(x.max()) < 256 and torch.equal(x[:, 1:], y[:, :-1])
