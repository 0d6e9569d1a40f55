"""Offline language-model data for `hal train`: documents from the Python standard library's own source
(every machine with Python has it, no download), a user's text files, JSONL files (one document per
line, its `text_field`) or pre-tokenised token shards; tokenised by hal.trainer.tokenizer (`bytes`, the
default, vocab 256; a tokenizer.json; `bpe:N`), each document followed by the end-of-text token (none
for bytes: files are joined as they are), and packed into windows of `seq + 1` tokens.

Split: text and token-shard files are held out for validation BY FILE (a stable hash of each file's
relative path, so adding a file moves no other); JSONL BY DOCUMENT (the hash of `<file>#<line>`), since a
JSONL file holds many documents; a token corpus whose hash holds out no shard (one shard) keeps the last
`val_fraction` of its tokens for validation.

Cache: a tokenizer other than bytes tokenises the corpus ONCE into token shards under `data.cache_dir`
(default `<run dir>/data-cache`), keyed by the corpus files' paths, sizes and mtimes, the data settings and
the tokenizer; `bpe:N` trains its tokenizer there first (key: the same files + N). Rank 0 builds it, the
other ranks wait (bounded: PREPARE_TIMEOUT_S) and read it; a second run reuses it.

Token shard format (the cache's, and `source = "tokens"`'s; nanoGPT / llm.c-like simplicity rather than
Megatron's .bin/.idx pair): `NAME.bin` = the token ids, little-endian uint8/uint16/uint32 (the narrowest
that holds the vocab), end-of-text ids between documents; `NAME.json` = {"format": "hal-tokens",
"version": 1, "dtype", "tokens", "vocab_size", "eos_id", "tokenizer", "tokenizer_fingerprint"}
(`write_shard` writes one). Shards are memory-mapped.

Order: window w of a stream is tokens [w*seq, w*seq + seq + 1) (consecutive windows share one token, so
every token is a target once per epoch). Global sample g = offset + step * global_batch + row is window
perm_e[g mod W] of epoch e = g // W, perm_e a permutation seeded by (seed, e): the position is a function
of the step and the global batch. Each rank gathers only the rows it reads (`read_rows`: its stage-0
inputs and last-stage targets; the plan cuts micro-batch m into rows [m*mb, (m+1)*mb) and replica j takes
`plan.rows(stage, j)`); the rows it does not read are zeros, which hal.strategies.apply never reads and
which count as tokens in the loss's global token count as the real rows would (packed windows have no
padding). The loader's position goes into each checkpoint's meta.json (`Loader.state`); a resume checks
tokenizer and seq (a change is refused: DataResumeError names both values) and continues at the next
unseen sequence, also under another global batch (the offset absorbs the difference).
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from .tokenizer import BYTE_VOCAB, Tokenizer, TokenizerError, parse_spec, spec_vocab, train_bpe

VOCAB = BYTE_VOCAB  # the bytes tokenizer's vocab (one definition: hal.trainer.tokenizer)
SHARD_FORMAT, SHARD_VERSION = "hal-tokens", 1
DEFAULT_GLOB = {"stdlib": "*.py", "files": "*.py", "jsonl": "*.jsonl", "tokens": "*.bin"}
PREPARE_TIMEOUT_S = 3600.0  # the other ranks' wait while rank 0 tokenises (or trains bpe:N) the corpus
ENCODE_CHUNK = 512  # documents per tokenizers.encode_batch call (one progress line per ~10%)

log = logging.getLogger(__name__)


class DataError(ValueError):
    """The corpus cannot be built (no files, too small for one window, a malformed JSONL line or shard)."""


class DataResumeError(DataError):
    """A checkpoint's data position that this run cannot continue (another tokenizer or seq); names both."""


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


_SKIP = {"site-packages", "__pycache__"}


def list_files(roots: Sequence[Path], pattern: str) -> list[tuple[Path, str]]:
    """(path, key) of every file, sorted by key; key = path relative to its root (the split hashes it).
    site-packages is skipped under the stdlib (it is not the standard library and differs by machine)."""
    out = []
    for root in roots:
        if root.is_file():
            out.append((root, root.name))
            continue
        if not root.is_dir():
            raise DataError(f"data path {root}: no such file or directory")
        if "/" in pattern:
            found = (p for p in root.rglob(pattern) if p.is_file())
        else:  # walk, pruning the skipped folders (the stdlib's site-packages holds torch: seconds to list)
            found = (Path(d) / f for d, dirs, files in os.walk(root) if not dirs.__setitem__(
                slice(None), [x for x in dirs if x not in _SKIP]) for f in fnmatch.filter(files, pattern))
        for p in found:
            rel = p.relative_to(root).as_posix()
            if not _SKIP.intersection(rel.split("/")):
                out.append((p, rel))
    return sorted(out, key=lambda t: t[1])


def _is_val(key: str, fraction: float) -> bool:
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    return (h % 1_000_000) < fraction * 1_000_000


def _roots(cfg) -> tuple[list[Path], str, str]:
    """(roots, glob, description) of the configured source."""
    d = cfg.data
    glob = d.glob or DEFAULT_GLOB[d.source]
    if d.source == "stdlib":
        return [stdlib_dir()], glob, f"Python standard library ({stdlib_dir()}, {glob})"
    roots = [cfg.resolve(p) for p in d.paths]
    return roots, glob, f"{d.source} {', '.join(map(str, roots))} ({glob})"


# ---- documents -------------------------------------------------------------------------------------
@dataclass
class Documents:
    """A text corpus's documents (raw bytes), split."""

    train: list[bytes]
    val: list[bytes]
    files: int
    nbytes: int


def _jsonl_docs(path: Path, key: str, text_field: str) -> list[tuple[str, bytes]]:
    out = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise DataError(f"{path}:{i}: not a JSON line ({exc})") from None
            text = row.get(text_field) if isinstance(row, dict) else None
            if not isinstance(text, str):
                raise DataError(f"{path}:{i}: no string field {text_field!r} (data.text_field)")
            out.append((f"{key}#{i}", text.encode("utf-8")))
    return out


def read_documents(cfg, files: Optional[list[tuple[Path, str]]] = None) -> Documents:
    """The configured text corpus's documents, in sorted path (and line) order, up to `max_bytes`
    (`files`: its list_files listing, when the caller has it)."""
    d = cfg.data
    roots, glob, source = _roots(cfg)
    train: list[bytes] = []
    val: list[bytes] = []
    used = total = 0
    for path, key in list_files(roots, glob) if files is None else files:
        if total >= d.max_bytes:
            break
        used += 1
        docs = _jsonl_docs(path, key, d.text_field) if d.source == "jsonl" else [(key, path.read_bytes())]
        for dkey, data in docs:
            data = data[: d.max_bytes - total]
            if not data:
                break
            total += len(data)
            (val if _is_val(dkey, d.val_fraction) else train).append(data)
    if not train or not val:
        raise DataError(f"{source}: {used} files, {total} bytes: too few for a train/validation split "
                        f"(train {len(train)} documents, validation {len(val)})")
    return Documents(train, val, used, total)


# ---- token shards ----------------------------------------------------------------------------------
def write_shard(stem: Path, ids: np.ndarray, tokenizer: Tokenizer) -> None:
    """Write `stem`.bin (the ids in the tokenizer's dtype) and `stem`.json (the header), each atomically."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    ids = np.ascontiguousarray(ids, dtype=tokenizer.dtype.newbyteorder("<"))
    header = {"format": SHARD_FORMAT, "version": SHARD_VERSION, "dtype": tokenizer.dtype.name,
              "tokens": int(ids.size), "vocab_size": tokenizer.vocab_size, "eos_id": tokenizer.eos_id,
              "tokenizer": tokenizer.name, "tokenizer_fingerprint": tokenizer.fingerprint}
    for suffix, write in ((".bin", lambda p: ids.tofile(p)), (".json", lambda p: p.write_text(json.dumps(header)))):
        tmp = stem.with_name(f"{stem.name}{suffix}.tmp{os.getpid()}")
        write(tmp)
        tmp.replace(stem.with_name(stem.name + suffix))


def read_header(bin_path: Path) -> dict:
    """The json header next to a token shard, checked."""
    hp = bin_path.with_suffix(".json")
    try:
        header = json.loads(hp.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"token shard {bin_path}: header {hp} unreadable ({exc})") from None
    if header.get("format") != SHARD_FORMAT or header.get("dtype") not in ("uint8", "uint16", "uint32"):
        raise DataError(f"token shard header {hp}: format {header.get('format')!r}, dtype {header.get('dtype')!r}: "
                        f"expected format {SHARD_FORMAT!r} with dtype uint8, uint16 or uint32")
    size = bin_path.stat().st_size if bin_path.is_file() else -1
    if size != header.get("tokens", -2) * np.dtype(header["dtype"]).itemsize:
        raise DataError(f"token shard {bin_path}: {size} bytes, header says {header.get('tokens')} x {header['dtype']}")
    return header


def read_shard(bin_path: Path) -> tuple[torch.Tensor, dict]:
    """(ids, header): the ids memory-mapped (copy-on-write, so torch gets a writable view)."""
    header = read_header(bin_path)
    if header["tokens"] == 0:
        return torch.zeros(0, dtype=torch.int64), header
    arr = np.memmap(bin_path, dtype=np.dtype(header["dtype"]).newbyteorder("<"), mode="c")
    return torch.from_numpy(arr), header


def _shard_files(cfg) -> list[tuple[Path, str]]:
    roots, glob, source = _roots(cfg)
    files = list_files(roots, glob)
    if not files:
        raise DataError(f"{source}: no token shards")
    return files


# ---- the corpus ------------------------------------------------------------------------------------
@dataclass
class Corpus:
    """Train and validation token streams (1-D integer tensors), where they came from, and the tokenizer."""

    train: torch.Tensor
    val: torch.Tensor
    files: int
    source: str
    tokenizer: Tokenizer = field(default_factory=Tokenizer.bytes)
    key: str = ""  # the corpus's fingerprint (files, sizes, mtimes, settings): the checkpoint records it
    cache: Optional[Path] = None  # the token cache it was read from
    _perms: dict = field(default_factory=dict, repr=False)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @classmethod
    def from_config(cls, cfg) -> "Corpus":
        """The configured corpus; a tokenizer other than bytes reads the token cache, building it when
        missing (call it on one rank first: `load_corpus`)."""
        if cfg.data.source == "tokens":
            return _token_corpus(cfg)
        kind, _ = parse_spec(cfg.data.tokenizer)
        if kind == "bytes":
            roots, glob, source = _roots(cfg)
            files = list_files(roots, glob)
            docs = read_documents(cfg, files)
            return cls(_bytes(docs.train), _bytes(docs.val), docs.files, source, key=corpus_key(cfg, files=files))
        return _cached_corpus(cfg)

    def order(self, seed: int, windows: int, epoch: int) -> torch.Tensor:
        """The permutation of `windows` training windows in `epoch` (cached: the last two epochs)."""
        k = (seed, windows, epoch)
        if k not in self._perms:
            gen = torch.Generator().manual_seed((seed * 1_000_003 + 7_919 * (epoch + 1)) % (1 << 62))
            self._perms[k] = torch.randperm(windows, generator=gen)
            for old in [x for x in self._perms if x[2] < epoch - 1]:
                del self._perms[old]
        return self._perms[k]


def _bytes(docs: list[bytes]) -> torch.Tensor:
    return torch.frombuffer(bytearray(b"".join(docs)), dtype=torch.uint8)


def corpus_key(cfg, tokenizer: str = "", files: Optional[list[tuple[Path, str]]] = None) -> str:
    """SHA-256 over the data settings, `tokenizer`, and the relative path, size and mtime of each corpus file
    read (text: in path order until `max_bytes`; JSONL and shards: all)."""
    d = cfg.data
    roots, glob, _ = _roots(cfg)
    h = hashlib.sha256(json.dumps([d.source, glob, d.max_bytes, d.val_fraction, d.text_field, tokenizer,
                                   [str(r) for r in roots]]).encode())
    total = 0
    for path, key in list_files(roots, glob) if files is None else files:
        if d.source in ("stdlib", "files") and total >= d.max_bytes:
            break
        st = path.stat()
        total += st.st_size
        h.update(f"{key}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def cache_dir(cfg) -> Path:
    return cfg.resolve(cfg.data.cache_dir) if cfg.data.cache_dir else cfg.run_dir / "data-cache"


def _tokenizer(cfg, docs_key: str, docs: Optional[Documents]) -> Tokenizer:
    """The configured tokenizer; bpe:N trained on `docs`' training documents when not cached yet."""
    kind, arg = parse_spec(cfg.data.tokenizer)
    if kind == "file":
        return Tokenizer.from_file(cfg.resolve(arg), cfg.data.eos)
    path = cache_dir(cfg) / f"bpe-{arg}-{docs_key[:16]}.json"
    if not path.is_file():
        if docs is None:
            raise DataError(f"bpe:{arg}: tokenizer cache {path} missing")
        train_bpe(docs.train, len(docs.train), arg, path)
    return Tokenizer.from_file(path, cfg.data.eos, name=f"bpe:{arg}")


def _encode(tok: Tokenizer, docs: list[bytes], part: str) -> np.ndarray:
    """Every document's ids, each followed by the end-of-text id, in one array (progress logged)."""
    t0, out, step = time.perf_counter(), [], max(ENCODE_CHUNK, len(docs) // 10)
    eos = np.asarray([] if tok.eos_id is None else [tok.eos_id], dtype=tok.dtype)
    for i in range(0, len(docs), ENCODE_CHUNK):
        for ids in tok.encode(docs[i:i + ENCODE_CHUNK]):
            out += [ids, eos]
        done = min(len(docs), i + ENCODE_CHUNK)
        if done % step < ENCODE_CHUNK or done == len(docs):
            log.info("  tokenising %s: %d/%d documents in %.1f s", part, done, len(docs), time.perf_counter() - t0)
    return np.concatenate(out) if out else np.zeros(0, dtype=tok.dtype)


def _cached_corpus(cfg) -> Corpus:
    """The token cache of this corpus and tokenizer, built (once) when missing."""
    docs_key = corpus_key(cfg)
    kind, arg = parse_spec(cfg.data.tokenizer)
    tok_id = (f"bpe:{arg}" if kind == "bpe" else
              f"{arg}:{hashlib.sha256(cfg.resolve(arg).read_bytes()).hexdigest()}") + f":eos={cfg.data.eos}"
    key = hashlib.sha256(f"{docs_key}\0{tok_id}".encode()).hexdigest()
    where = cache_dir(cfg) / f"tokens-{key[:16]}"
    source = _roots(cfg)[2]
    if not (where / "val.json").is_file():
        t0 = time.perf_counter()
        docs = read_documents(cfg)
        tok = _tokenizer(cfg, docs_key, docs)
        log.info("hal train: tokenising %s (%d documents, %.1f MB) with %s into %s", source,
                 len(docs.train) + len(docs.val), docs.nbytes / 1e6, tok.name, where)
        meta = {"files": docs.files, "source": source}
        write_shard(where / "train", _encode(tok, docs.train, "train"), tok)
        (where / "corpus.json").write_text(json.dumps(meta))
        write_shard(where / "val", _encode(tok, docs.val, "validation"), tok)  # written last: the cache is whole
        log.info("hal train: token cache %s written in %.1f s", where, time.perf_counter() - t0)
    tok = _tokenizer(cfg, docs_key, None)
    train, _ = read_shard(where / "train.bin")
    val, _ = read_shard(where / "val.bin")
    files = json.loads((where / "corpus.json").read_text()).get("files", 0)
    return Corpus(train, val, files, source, tok, key, where)


def _token_corpus(cfg) -> Corpus:
    """source = "tokens": shards held out by file; with none held out, the tail of the stream."""
    files = _shard_files(cfg)
    train, val, headers = [], [], []
    for path, key in files:
        ids, header = read_shard(path)
        headers.append(header)
        (val if _is_val(key, cfg.data.val_fraction) else train).append(ids)
    fps = {h.get("tokenizer_fingerprint") for h in headers}
    if len(fps) > 1:
        raise DataError(f"token shards of {_roots(cfg)[2]} come from {len(fps)} tokenizers: {sorted(map(str, fps))}")
    h0 = headers[0]
    tok = Tokenizer(h0.get("tokenizer", "?"), max(h["vocab_size"] for h in headers), h0.get("eos_id"),
                    str(h0.get("tokenizer_fingerprint")))
    cat = (lambda xs: xs[0] if len(xs) == 1 else torch.cat([x.long() for x in xs]))
    if not train:
        raise DataError(f"{_roots(cfg)[2]}: every shard is held out for validation; add shards or lower "
                        f"data.val_fraction = {cfg.data.val_fraction}")
    t = cat(train)
    if val:
        v = cat(val)
    else:  # one shard (or none hashed out): the last val_fraction of the stream
        cut = t.numel() - max(1, int(t.numel() * cfg.data.val_fraction))
        t, v = t[:cut], t[cut:]
    return Corpus(t, v, len(files), _roots(cfg)[2], tok, corpus_key(cfg, tok.fingerprint, files))


def check_data(cfg) -> int:
    """Before launch: the data paths exist and the tokenizer (or the shards' header) is readable; returns
    the vocab the model must cover. A problem is a DataError / TokenizerError naming the entry."""
    d = cfg.data
    if d.source != "stdlib":
        for p in d.paths:
            if not cfg.resolve(p).exists():
                raise TokenizerError("data.paths", p, f"no such file or folder ({cfg.resolve(p)})")
    if d.source == "tokens":
        return max(read_header(path)["vocab_size"] for path, _ in _shard_files(cfg))
    return spec_vocab(d.tokenizer, cfg.resolve)


def needs_cache(cfg) -> bool:
    return cfg.data.source != "tokens" and parse_spec(cfg.data.tokenizer)[0] != "bytes"


def load_corpus(cfg, rank: int, group: Any) -> Corpus:
    """Every rank's corpus; with a token cache to build, rank 0 builds it first and the others wait on a
    bounded barrier of `group` (gloo), then read it: the corpus is tokenised once, not once per rank."""
    if not needs_cache(cfg):
        return Corpus.from_config(cfg)
    import torch.distributed as dist
    from datetime import timedelta
    corpus = Corpus.from_config(cfg) if rank == 0 else None
    dist.monitored_barrier(group=group, timeout=timedelta(seconds=PREPARE_TIMEOUT_S))
    return corpus if corpus is not None else Corpus.from_config(cfg)


# ---- windows and the loader ------------------------------------------------------------------------
def _windows(data: torch.Tensor, seq: int, what: str) -> int:
    n = (data.numel() - 1) // seq
    if n < 1:
        raise DataError(f"{what} part of the corpus has {data.numel()} tokens, fewer than one window of {seq + 1}")
    return n


def _gather(data: torch.Tensor, ids: torch.Tensor, seq: int, rows: Optional[Sequence[tuple[int, int]]]):
    """(inputs, targets) (len(ids), seq) int64 of windows `ids`; with `rows`, only those rows (the rest 0)."""
    out = torch.zeros(ids.numel(), seq + 1, dtype=torch.int64)
    sel = torch.arange(ids.numel()) if rows is None else torch.tensor(
        sorted({r for lo, hi in rows for r in range(lo, hi)}), dtype=torch.int64)
    if sel.numel():
        idx = ids[sel, None] * seq + torch.arange(seq + 1)[None, :]
        out[sel] = data[idx].long()
    return out[:, :-1].contiguous(), out[:, 1:].contiguous()


class Loader:
    """The training stream of one run: global batch `step` is samples offset + step * global_batch ...
    (module doc); `rows` = the rows this rank reads (None: all)."""

    def __init__(self, corpus: Corpus, seed: int, global_batch: int, seq: int,
                 rows: Optional[Sequence[tuple[int, int]]] = None, offset: int = 0) -> None:
        self.corpus, self.seed, self.global_batch, self.seq = corpus, seed, global_batch, seq
        self.rows, self.offset = rows, offset
        self.windows = _windows(corpus.train, seq, "training")

    def ids(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(epoch, window id) of each row of step `step`'s global batch."""
        g = self.offset + step * self.global_batch + torch.arange(self.global_batch)
        epochs, pos = g // self.windows, g % self.windows
        out = torch.empty_like(pos)
        for e in epochs.unique().tolist():
            m = epochs == e
            out[m] = self.corpus.order(self.seed, self.windows, e)[pos[m]]
        return epochs, out

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (global_batch, seq) int64 (rows this rank does not read are 0)."""
        return _gather(self.corpus.train, self.ids(step)[1], self.seq, self.rows)

    def state(self, done: int) -> dict:
        """The position after `done` steps: what a checkpoint records (meta.json "data")."""
        g = self.offset + done * self.global_batch
        return {"sequences": g, "tokens": g * self.seq, "epoch": g // self.windows,
                "epoch_position": g % self.windows, "windows_per_epoch": self.windows,
                "global_batch": self.global_batch,
                "seq": self.seq, "seed": self.seed, "tokenizer": self.corpus.tokenizer.name,
                "tokenizer_fingerprint": self.corpus.tokenizer.fingerprint, "corpus": self.corpus.key}

    def resume(self, saved: Optional[dict], step: int) -> None:
        """Continue after a checkpoint of step `step` whose data position is `saved` (None: a checkpoint
        without one, from before positions were recorded: the step's own position is used)."""
        if not saved:
            return
        now = self.state(step)
        if saved.get("tokenizer_fingerprint") != now["tokenizer_fingerprint"]:
            raise DataResumeError(f"resume at step {step}: the checkpoint's data was tokenised by "
                                  f"{saved.get('tokenizer')!r} ({saved.get('tokenizer_fingerprint')}), this run's by "
                                  f"{now['tokenizer']!r} ({now['tokenizer_fingerprint']}): restore data.tokenizer "
                                  f"or start a new run directory")
        if saved.get("seq") != self.seq:
            raise DataResumeError(f"resume at step {step}: the checkpoint's windows are seq = {saved.get('seq')} "
                                  f"tokens, this run's seq = {self.seq}: restore it or start a new run directory")
        if saved.get("corpus") != now["corpus"] or saved.get("windows_per_epoch") != self.windows:
            log.warning("hal train: resume at step %d: the corpus changed since the checkpoint (%s windows per "
                        "epoch then, %d now): continuing at sequence %d of the new corpus's order", step,
                        saved.get("windows_per_epoch"), self.windows, saved["sequences"])
        self.offset = int(saved["sequences"]) - step * self.global_batch
        if saved.get("global_batch") != self.global_batch:
            log.info("hal train: resume at step %d: global batch %s then, %d now: continuing at sequence %d", step,
                     saved.get("global_batch"), self.global_batch, saved["sequences"])


def train_batch(corpus: Corpus, seed: int, step: int, global_batch: int, seq: int,
                rows: Optional[Sequence[tuple[int, int]]] = None):
    """(inputs, targets), each (global_batch, seq) int64: the global batch of `step` of a run that did not
    change its global batch, a pure function of (seed, step)."""
    return Loader(corpus, seed, global_batch, seq, rows).batch(step)


def val_batches(corpus: Corpus, seed: int, count: int, global_batch: int, seq: int,
                rows: Optional[Sequence[tuple[int, int]]] = None):
    """The fixed validation batches (the same at every evaluation): the first count x global_batch
    windows of a seeded permutation of the validation windows (repeating when there are fewer)."""
    n = _windows(corpus.val, seq, "validation")
    gen = torch.Generator().manual_seed(seed * 1_000_003 - 1)
    perm = torch.randperm(n, generator=gen)
    ids = perm[torch.arange(count * global_batch) % n]
    return [_gather(corpus.val, ids[i * global_batch:(i + 1) * global_batch], seq, rows) for i in range(count)]


def replica_rows(plan, rank: int) -> list[tuple[int, int]]:
    """Rows [lo, hi) of the global batch that `rank`'s first stage reads, one range per micro-batch
    (the cut hal.strategies.apply.AppliedPlan._rows makes); [] for a rank the plan leaves idle."""
    if rank not in plan.ranks:
        return []
    role = plan.roles(rank)[0]  # the first stage this rank holds
    lo, hi = plan.rows(role.stage, role.replica)
    mb = plan.microbatch_size
    return [(m * mb + lo, m * mb + hi) for m in range(plan.num_microbatches)]


def read_rows(plan, rank: int) -> list[tuple[int, int]]:
    """Rows [lo, hi) of the global batch `rank` reads: those of its roles on the first stage (inputs)
    and the last stage (targets); [] for a rank that holds only middle stages or none."""
    if rank not in plan.ranks:
        return []
    last, mb = len(plan.stages) - 1, plan.microbatch_size
    out = set()
    for role in plan.roles(rank):
        if role.stage in (0, last):
            lo, hi = plan.rows(role.stage, role.replica)
            out.update((m * mb + lo, m * mb + hi) for m in range(plan.num_microbatches))
    return sorted(out)


# ---- the position in a checkpoint ------------------------------------------------------------------
POSITION_FILE = "data.json"  # in the checkpoint's step folder, next to DCP's files and meta.json


def save_position(step_path: Path, state: dict) -> None:
    """Rank 0, before the checkpoint of that step is written: the loader's position (`Loader.state`), so
    it is covered by the checkpoint's completion mark and manifest like its other files."""
    step_path.mkdir(parents=True, exist_ok=True)
    tmp = step_path / f"{POSITION_FILE}.tmp{os.getpid()}"
    tmp.write_text(json.dumps(state, indent=1) + "\n")
    tmp.replace(step_path / POSITION_FILE)


def load_position(step_path: Path) -> Optional[dict]:
    """The position a checkpoint recorded; None for one written without it (a mid-run re-plan's save)."""
    try:
        return json.loads((step_path / POSITION_FILE).read_text())
    except (OSError, ValueError):
        return None
