"""Small tokenizers of the two decoding families MILI serves, trained in the test: byte-level BPE (as
Qwen, SmolLM2, Llama 3) and SentencePiece-style (Llama 2: '▁' word marks, <0xNN> byte fallback)."""

from __future__ import annotations

import functools
import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS = ["naïve café déjà vu, crème brûlée à la française", "日本語のテキストと漢字、カタカナ",
          "emoji 😀🎉🚀 and flags 🇫🇷🇯🇵", "Ελληνικά γράμματα και русский текст", "plain ascii words " * 3]


def byte_bpe() -> Tokenizer:
    """A small byte-level BPE: most non-ASCII characters span several tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS * 4, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def sentencepiece(decoder: str = "fuse_strip") -> Tokenizer:
    """A Llama-2-style tokenizer: '▁' word marks, <0xNN> byte fallback for characters outside the
    vocabulary, and a decoder that drops the leading space of a decode's first token: either Llama 2's
    Replace/ByteFallback/Fuse/Strip sequence ("fuse_strip") or ByteFallback then the Metaspace decoder
    ("metaspace")."""
    base = Tokenizer(models.BPE())
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    # Trained on the ASCII of the corpus only, so every other character is spelled in <0xNN> tokens.
    ascii_corpus = [line.encode("ascii", "ignore").decode() for line in CORPUS]
    base.train_from_iterator(ascii_corpus * 4, trainers.BpeTrainer(vocab_size=200,
                                                                   special_tokens=["<unk>", "<s>", "</s>"]))
    spec = json.loads(base.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    spec["model"].update(byte_fallback=True, unk_token="<unk>")
    tok = Tokenizer.from_str(json.dumps(spec))
    if decoder == "fuse_strip":
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    else:
        tok.decoder = decoders.Sequence([decoders.ByteFallback(),
                                         decoders.Metaspace(replacement="▁", prepend_scheme="first")])
    return tok


@functools.cache
def default_tokenizer() -> Tokenizer:
    """The default model's tokenizer (SmolLM2's byte-level BPE, as the Qwen family's); one shared object,
    not to be modified."""
    from shared.default_model import default_model_path

    return Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
