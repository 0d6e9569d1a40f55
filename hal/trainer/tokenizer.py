"""Tokenizers of `hal train`'s data (`[data] tokenizer`): `bytes` (the default: vocab 256, a document's
UTF-8 bytes are its tokens), a Hugging Face `tokenizers` tokenizer.json (a path), or `bpe:N`, a byte-level
BPE of vocab N trained with the `tokenizers` library on the corpus's training documents at first use and
cached (hal.trainer.data builds and caches it; this module trains and loads it).

`tokenizers` (the `hf` extra) is imported only for a tokenizer.json or `bpe:N`. This module imports no
other part of hal.trainer (hal.trainer.config calls `spec_vocab` to check the model's vocab before launch).
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np

BYTE_VOCAB = 256  # the `bytes` tokenizer's vocab (one definition; hal.trainer.config re-exports it)
BPE_EOS = "<|endoftext|>"  # the end-of-text token `bpe:N` adds (id 0), GPT-2's name for it
# end-of-text tokens looked for in a tokenizer.json when `data.eos` names none (Llama 2 / Mistral,
# GPT-2 / Qwen, Llama 3, Gemma)
KNOWN_EOS = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>")
MAX_BPE_VOCAB = 1 << 20

log = logging.getLogger(__name__)


class TokenizerError(ValueError):
    """A tokenizer spec that names nothing usable (bad `bpe:N`, a missing or unreadable tokenizer.json,
    an `eos` token it does not hold); `field` and `value` name the config entry."""

    def __init__(self, field: str, value: Any, problem: str) -> None:
        self.field, self.value, self.problem = field, value, problem
        super().__init__(f"{field} = {value!r}: {problem}")


def parse_spec(spec: Optional[str]) -> tuple[str, Any]:
    """("bytes", None) | ("bpe", N) | ("file", path string) of a `data.tokenizer` value (None = bytes)."""
    if spec is None or spec == "bytes":
        return "bytes", None
    if spec.startswith("bpe:"):
        n = spec[4:]
        if not n.isdigit() or not BYTE_VOCAB < int(n) <= MAX_BPE_VOCAB:
            raise TokenizerError("data.tokenizer", spec, f"bpe:N needs an integer N in ({BYTE_VOCAB}, "
                                 f"{MAX_BPE_VOCAB}] (256 byte tokens + the end-of-text token + merges)")
        return "bpe", int(n)
    return "file", spec


def _hf(path: Path):
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError as exc:
        raise TokenizerError("data.tokenizer", str(path), "needs the `tokenizers` package: "
                             "pip install 'hetero-hal[hf]'") from exc
    if not path.is_file():
        raise TokenizerError("data.tokenizer", str(path), "no such file (a Hugging Face tokenizer.json)")
    try:
        return HFTokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises a plain Exception with its parse error
        raise TokenizerError("data.tokenizer", str(path), f"not a tokenizer.json `tokenizers` can read: {exc}") \
            from None


def spec_vocab(spec: Optional[str], resolve) -> int:
    """The vocab a `data.tokenizer` value gives (bpe:N: N, an upper bound: a small corpus may yield fewer
    merges), without training anything: what the model's vocab must cover. `resolve(path)` -> Path."""
    kind, arg = parse_spec(spec)
    if kind == "bytes":
        return BYTE_VOCAB
    if kind == "bpe":
        return arg
    return _hf(resolve(arg)).get_vocab_size(with_added_tokens=True)


@dataclass
class Tokenizer:
    """One tokenizer: its name (the config's spec), vocab, end-of-text id (None: documents are joined
    without a separator) and fingerprint (what a checkpoint and the token cache compare)."""

    name: str
    vocab_size: int
    eos_id: Optional[int]
    fingerprint: str
    hf: Any = field(default=None, repr=False)  # tokenizers.Tokenizer; None for bytes

    @classmethod
    def bytes(cls) -> "Tokenizer":
        return cls("bytes", BYTE_VOCAB, None, "bytes")

    @classmethod
    def from_file(cls, path: Path, eos: Optional[str] = None, name: Optional[str] = None) -> "Tokenizer":
        tok = _hf(path)
        eos_id = _eos_id(tok, path, eos)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        return cls(name or str(path), tok.get_vocab_size(with_added_tokens=True), eos_id, f"sha256:{digest}", tok)

    @property
    def dtype(self) -> np.dtype:
        """The narrowest unsigned type holding every id (the token shards' dtype)."""
        return np.dtype(np.uint8 if self.vocab_size <= 256 else np.uint16 if self.vocab_size <= 65536 else np.uint32)

    def encode(self, docs: Sequence[bytes]) -> list[np.ndarray]:
        """Each document's ids (a document is its raw bytes; the HF tokenizers get them decoded as UTF-8,
        undecodable bytes replaced)."""
        if self.hf is None:
            return [np.frombuffer(d, dtype=np.uint8) for d in docs]
        enc = self.hf.encode_batch([d.decode("utf-8", errors="replace") for d in docs], add_special_tokens=False)
        return [np.asarray(e.ids, dtype=self.dtype) for e in enc]


def _eos_id(tok, path: Path, eos: Optional[str]) -> Optional[int]:
    """`eos` (data.eos) if given; else tokenizer_config.json's eos_token next to the file; else the first
    of KNOWN_EOS the vocab holds; else None."""
    if eos is not None:
        i = tok.token_to_id(eos)
        if i is None:
            raise TokenizerError("data.eos", eos, f"not a token of {path}")
        return i
    side = path.parent / "tokenizer_config.json"
    if side.is_file():
        try:
            named = json.loads(side.read_text()).get("eos_token")
        except (OSError, ValueError):
            named = None
        named = named.get("content") if isinstance(named, dict) else named
        if isinstance(named, str) and tok.token_to_id(named) is not None:
            return tok.token_to_id(named)
    for name in KNOWN_EOS:
        if tok.token_to_id(name) is not None:
            return tok.token_to_id(name)
    return None


def train_bpe(docs: Iterable[bytes], count: int, vocab: int, out: Path) -> None:
    """Train a byte-level BPE of `vocab` tokens (BPE_EOS = id 0, then the 256 byte symbols, then merges)
    on `count` documents with the `tokenizers` library and write its tokenizer.json to `out` (atomically).
    Logs progress as the documents are fed (the merges' own phase is one line)."""
    try:
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers
    except ImportError as exc:
        raise TokenizerError("data.tokenizer", f"bpe:{vocab}", "needs the `tokenizers` package: "
                             "pip install 'hetero-hal[hf]'") from exc
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[BPE_EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t0, fed = time.perf_counter(), [0, 0]
    step = max(1, count // 10)

    def feed():
        for d in docs:
            fed[0] += 1
            fed[1] += len(d)
            if fed[0] % step == 0 or fed[0] == count:
                log.info("  bpe:%d: read %d/%d documents (%.1f MB) in %.1f s", vocab, fed[0], count,
                         fed[1] / 1e6, time.perf_counter() - t0)
            yield d.decode("utf-8", errors="replace")
    log.info("hal train: training a byte-level BPE of vocab %d on %d documents (tokenizers library) -> %s",
             vocab, count, out)
    tok.train_from_iterator(feed(), trainer=trainer, length=count)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{time.time_ns()}")
    tok.save(str(tmp))
    tmp.replace(out)
    log.info("hal train: bpe:%d trained in %.1f s: %d tokens (%s)", vocab, time.perf_counter() - t0,
             tok.get_vocab_size(with_added_tokens=True), out)
