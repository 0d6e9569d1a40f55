"""`[data] tokenizer` and the corpora (hal/trainer/tokenizer.py, hal/trainer/data.py), in-process: a
`bpe:N` is trained once on the corpus and cached with its token shards (a second build reuses both; a
changed file rebuilds), a tokenizer.json is read with its end-of-text token, JSONL documents are split by
document, pre-tokenised shards are read by their header, and the model's vocab must cover the tokenizer's
(refused with both numbers by TrainConfig.load_model_config, the check `hal train` runs before launch)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from hal.trainer import data as data_mod
from hal.trainer.config import TrainConfig, TrainConfigError
from hal.trainer.data import Corpus, DataError, read_shard, write_shard
from hal.trainer.tokenizer import BPE_EOS, Tokenizer, TokenizerError, parse_spec

ROOT = Path(__file__).resolve().parent.parent
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega").split()


def _cfg(tmp: Path, vocab: int = 256, **data) -> TrainConfig:
    return TrainConfig(seed=1, steps=10, global_batch=4,
                       model={"path": str(ROOT / "examples/models/tiny.toml"), "overrides": {"vocab": vocab, "seq": 16}},
                       data={"cache_dir": str(tmp / "cache"), **data}, log={"dir": str(tmp / "run")},
                       optimizer={"warmup_steps": 1})


def _texts(folder: Path, n: int = 12) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        words = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(300)]
        (folder / f"doc{i:02d}.txt").write_text(" ".join(words) + "\n")
    return folder


def test_spec_parse_and_the_model_vocab_must_cover_the_tokenizer(tmp_path):
    assert parse_spec(None) == ("bytes", None) and parse_spec("bytes") == ("bytes", None)
    assert parse_spec("bpe:512") == ("bpe", 512) and parse_spec("t/tokenizer.json") == ("file", "t/tokenizer.json")
    for bad in ("bpe:12", "bpe:x", "bpe:256"):
        with pytest.raises(TokenizerError, match=r"data\.tokenizer = 'bpe:"):
            parse_spec(bad)
    texts = _texts(tmp_path / "t")
    with pytest.raises(TrainConfigError, match=r"data\.tokenizer = 'bpe:400'.* 400 tokens, the model's vocab = 256"):
        _cfg(tmp_path, source="files", paths=[str(texts)], glob="*.txt", tokenizer="bpe:400").load_model_config()
    ok = _cfg(tmp_path, vocab=400, source="files", paths=[str(texts)], glob="*.txt", tokenizer="bpe:400")
    assert ok.load_model_config().vocab == 400  # a bigger model vocab is fine too (unused rows)
    with pytest.raises(TrainConfigError, match=r"data\.tokenizer = '.*nope.json': no such file"):
        _cfg(tmp_path, source="files", paths=[str(texts)], tokenizer=str(tmp_path / "nope.json")).load_model_config()
    with pytest.raises(TrainConfigError, match=r"data\.paths = .*missing.*no such file"):
        _cfg(tmp_path, source="jsonl", paths=[str(tmp_path / "missing")]).load_model_config()
    with pytest.raises(TrainConfigError, match=r"data\.paths = \[\]: data\.source = 'jsonl' needs at least one path"):
        _cfg(tmp_path, source="jsonl")


def test_bpe_is_trained_once_cached_and_reused(tmp_path, monkeypatch):
    texts = _texts(tmp_path / "t")
    cfg = _cfg(tmp_path, vocab=300, source="files", paths=[str(texts)], glob="*.txt", val_fraction=0.3,
               tokenizer="bpe:300")
    trained = []
    real = data_mod.train_bpe
    monkeypatch.setattr(data_mod, "train_bpe", lambda *a: (trained.append(a[2]), real(*a)))
    first = Corpus.from_config(cfg)
    tok = first.tokenizer
    assert trained == [300] and tok.name == "bpe:300" and 256 < tok.vocab_size <= 300
    assert tok.eos_id == tok.hf.token_to_id(BPE_EOS) == 0 and first.train.dtype == torch.uint16
    assert first.cache is not None and (first.cache / "train.bin").is_file()
    n_train = len([p for p in texts.iterdir() if not data_mod._is_val(p.name, 0.3)])
    assert int((first.train == 0).sum()) == n_train  # one end-of-text after each training document
    first_doc = next(p for p in sorted(texts.iterdir()) if not data_mod._is_val(p.name, 0.3))
    ids = first.train.tolist()
    assert tok.hf.decode(ids[:ids.index(0)]) == first_doc.read_text()  # the document, back from its ids
    assert ids.index(0) < first_doc.stat().st_size / 2  # merges learnt: far fewer ids than bytes
    again = Corpus.from_config(cfg)  # the second run: the same tokens, nothing trained or tokenised
    assert trained == [300] and torch.equal(again.train, first.train) and torch.equal(again.val, first.val)
    assert again.key == first.key and again.tokenizer.fingerprint == tok.fingerprint
    doc = texts / "doc03.txt"  # a changed file (size and mtime): another key, trained again
    doc.write_text(doc.read_text() + "omega omega\n")
    os.utime(doc, ns=(doc.stat().st_mtime_ns + 10**9,) * 2)
    changed = Corpus.from_config(cfg)
    assert trained == [300, 300] and changed.key != first.key and changed.cache != first.cache


def test_tokenizer_json_with_its_end_of_text_token(tmp_path):
    from tokenizers import Tokenizer as HF
    from tokenizers import models, pre_tokenizers
    hf = HF(models.WordLevel({"[UNK]": 0, "</s>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "hf" / "tokenizer.json"
    path.parent.mkdir()
    hf.save(str(path))
    texts = _texts(tmp_path / "t", 6)
    cfg = _cfg(tmp_path, vocab=64, source="files", paths=[str(texts)], glob="*.txt", val_fraction=0.4,
               tokenizer=str(path))
    assert cfg.load_model_config().vocab == 64
    corpus = Corpus.from_config(cfg)
    assert corpus.vocab_size == len(WORDS) + 2 and corpus.tokenizer.eos_id == 1  # "</s>", a well-known name
    first_doc = next(p for p in sorted(texts.iterdir()) if not data_mod._is_val(p.name, 0.4))
    words = first_doc.read_text().split()
    assert corpus.train.dtype == torch.uint8 and corpus.train[:len(words) + 1].tolist() == \
        [2 + WORDS.index(w) for w in words] + [1]  # the first training document's words, then its end-of-text
    assert 0 not in corpus.train.tolist()  # every word known: no [UNK]
    (path.parent / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "omega"}}))
    assert Tokenizer.from_file(path).eos_id == 2 + WORDS.index("omega")  # tokenizer_config.json's eos_token wins
    with pytest.raises(TokenizerError, match=r"data\.eos = '<\|eot\|>': not a token of"):
        Tokenizer.from_file(path, eos="<|eot|>")


def test_jsonl_documents_are_split_by_document(tmp_path):
    folder = tmp_path / "j"
    folder.mkdir()
    rows = [{"body": f"document {i} " + " ".join(WORDS[i % 5:]), "id": i} for i in range(40)]
    (folder / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    cfg = _cfg(tmp_path, source="jsonl", paths=[str(folder)], text_field="body", val_fraction=0.3)
    corpus = Corpus.from_config(cfg)  # bytes: documents joined as they are
    train, val = bytes(corpus.train.tolist()), bytes(corpus.val.tolist())
    held = [i for i in range(40) if data_mod._is_val(f"a.jsonl#{i + 1}", 0.3)]
    assert 0 < len(held) < 40 and corpus.files == 1
    for i, r in enumerate(rows):
        assert r["body"].encode() in (val if i in held else train)
    (folder / "b.jsonl").write_text('{"body": "fine"}\n{"text": "no body"}\n')
    with pytest.raises(DataError, match=r"b\.jsonl:2: no string field 'body' \(data\.text_field\)"):
        Corpus.from_config(cfg)
    (folder / "b.jsonl").write_text('{"body": "fine"}\nnot json\n')
    with pytest.raises(DataError, match=r"b\.jsonl:2: not a JSON line"):
        Corpus.from_config(cfg)


def test_pretokenised_shards(tmp_path):
    tok = Tokenizer("my-bpe", 1000, 999, "sha256:abc")
    shards = tmp_path / "shards"
    ids = np.arange(5000, dtype=np.int64) % 999
    write_shard(shards / "part0", ids, tok)
    header = json.loads((shards / "part0.json").read_text())
    assert header == {"format": "hal-tokens", "version": 1, "dtype": "uint16", "tokens": 5000, "vocab_size": 1000,
                      "eos_id": 999, "tokenizer": "my-bpe", "tokenizer_fingerprint": "sha256:abc"}
    assert (shards / "part0.bin").stat().st_size == 10000
    back, _ = read_shard(shards / "part0.bin")
    assert back.long().tolist() == ids.tolist()
    with pytest.raises(TrainConfigError, match=r"the tokenizer's vocab is 1000 tokens, the model's vocab = 256"):
        _cfg(tmp_path, source="tokens", paths=[str(shards)]).load_model_config()
    cfg = _cfg(tmp_path, vocab=1000, source="tokens", paths=[str(shards)], val_fraction=0.1)
    assert cfg.load_model_config().vocab == 1000
    one = Corpus.from_config(cfg)  # a single shard: its last 10% is the validation part
    assert one.train.numel() == 4500 and one.val.long().tolist() == ids[4500:].tolist()
    assert one.vocab_size == 1000 and one.tokenizer.eos_id == 999 and one.tokenizer.fingerprint == "sha256:abc"
    with open(shards / "part0.bin", "ab") as fh:
        fh.write(b"\0")  # a shard that does not match its header
    with pytest.raises(DataError, match=r"part0\.bin: 10001 bytes, header says 5000 x uint16"):
        Corpus.from_config(cfg)


def test_load_corpus_rank_0_builds_the_cache_the_others_only_read_it(tmp_path, monkeypatch):
    import torch.distributed as dist
    texts = _texts(tmp_path / "t", 6)
    cfg = _cfg(tmp_path, vocab=300, source="files", paths=[str(texts)], glob="*.txt", val_fraction=0.4,
               tokenizer="bpe:300")
    with pytest.raises(DataError, match=r"bpe:300: tokenizer cache .* missing"):
        data_mod._tokenizer(cfg, data_mod.corpus_key(cfg), None)  # a reader without the cache does not build it
    calls = []
    monkeypatch.setattr(dist, "monitored_barrier", lambda group, timeout: calls.append(timeout.total_seconds()))
    rank0 = data_mod.load_corpus(cfg, 0, None)  # builds it, then meets the others at the barrier
    monkeypatch.setattr(data_mod, "train_bpe", lambda *a: pytest.fail("rank 1 must not train"))
    monkeypatch.setattr(data_mod, "_encode", lambda *a: pytest.fail("rank 1 must not tokenise"))
    rank1 = data_mod.load_corpus(cfg, 1, None)  # after the barrier: reads what rank 0 wrote
    assert calls == [data_mod.PREPARE_TIMEOUT_S] * 2 and torch.equal(rank0.train, rank1.train)
