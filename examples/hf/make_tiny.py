"""Make a tiny random Hugging Face Llama checkpoint (grouped-query attention) and its tokenizer.json
offline, for examples/train/llama-hf.toml and the HF tests: no download, only `transformers` and
`tokenizers` (pip install 'hetero-hal[hf]').

    python examples/hf/make_tiny.py                       # -> runs/hf/tiny-llama (vocab 512 BPE)
    python examples/hf/make_tiny.py --out DIR --vocab 256 --no-tokenizer   # byte-level ids, no tokenizer

The tokenizer is a byte-level BPE trained with `tokenizers` on the Python standard library's source
(the corpus `hal train` reads by default; every machine with Python has it). The weights are
transformers' own random init from `--seed`: a stand-in for a real checkpoint of the same family
(the loss starts near ln(vocab)), the same files and keys `save_pretrained` writes for Llama.
"""
from __future__ import annotations

import argparse
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent.parent / "runs" / "hf" / "tiny-llama"  # runs/ is git-ignored
EOS = "</s>"


def train_tokenizer(vocab: int, max_bytes: int = 4 << 20):
    """A byte-level BPE of `vocab` tokens (EOS first) trained on the stdlib's *.py files (sorted, capped)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)

    def texts():
        used = 0
        for p in files:
            if used >= max_bytes:
                return
            data = p.read_bytes()
            used += len(data)
            yield data.decode("utf-8", errors="replace")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts(), trainer=trainer)
    return tok


def make_tiny_llama(out, vocab: int = 512, hidden: int = 64, ffn: int = 176, layers: int = 4, heads: int = 4,
                    kv_heads: int = 2, seq: int = 256, seed: int = 0, tokenizer: bool = True,
                    tie: bool = False) -> Path:
    """Write config.json, model.safetensors (and tokenizer.json + tokenizer_config.json) into `out`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    eos = 0
    if tokenizer:
        from transformers import PreTrainedTokenizerFast
        tok = train_tokenizer(vocab)
        vocab = tok.get_vocab_size()
        eos = tok.token_to_id(EOS)
        PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS).save_pretrained(out)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=seq,
                         rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=tie, bos_token_id=eos,
                         eos_token_id=eos, torch_dtype="float32")
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(DEFAULT_OUT), help="output directory (default: %(default)s)")
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--ffn", type=int, default=176)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--seq", type=int, default=256, help="max_position_embeddings")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tie", action="store_true", help="tie_word_embeddings")
    p.add_argument("--no-tokenizer", action="store_true", help="no tokenizer.json (byte ids: use --vocab 256)")
    a = p.parse_args(argv)
    out = make_tiny_llama(a.out, a.vocab, a.hidden, a.ffn, a.layers, a.heads, a.kv_heads, a.seq, a.seed,
                          tokenizer=not a.no_tokenizer, tie=a.tie)
    print(f"wrote {out}: {', '.join(sorted(f.name for f in out.iterdir()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
