"""Rebuild a Hugging Face `tokenizers` tokenizer from the vocabulary a GGUF file carries.

Only byte-level BPE (`tokenizer.ggml.model == "gpt2"`) is supported: that is what Llama 3, Qwen 2/3
and SmolLM ship. The GGUF stores tokens, merges and token types but not the pre-tokenizer, only
llama.cpp's name for it (`tokenizer.ggml.pre`); the split regexes below are copied from llama.cpp's
`src/llama-vocab.cpp` (`llm_tokenizer_bpe`), which applies each regex in turn to every piece the
previous one produced, keeping both matches and the text between them -- exactly what a sequence of
`Split(..., behavior="isolated")` pre-tokenizers does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

# llama.cpp token types (gguf.TokenType)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 2, 3, 4

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# llama.cpp spells the original `(?i:'s|...)` out case by case; the two are equivalent.
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")


@dataclass(frozen=True)
class PreTokenizerSpec:
    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a piece that is already a whole token is not re-merged (llama3)
    add_bos: bool = False  # llama.cpp's default when the file has no tokenizer.ggml.add_bos_token
    clean_spaces: bool = True  # llama.cpp's detokenizer cleanup, = HF clean_up_tokenization_spaces


_SPEC_LLAMA3 = PreTokenizerSpec((_LLAMA3,), ignore_merges=True, add_bos=True)
_SPEC_LLAMA3_REGEX_ONLY = PreTokenizerSpec((_LLAMA3,))
_SPEC_GPT2 = PreTokenizerSpec((_GPT2,))
_SPEC_QWEN2 = PreTokenizerSpec((_QWEN2,), clean_spaces=False)
_SPEC_DIGITS_GPT2 = PreTokenizerSpec((r"\p{N}", _GPT2))

# tokenizer.ggml.pre value -> how llama.cpp pre-tokenizes it (src/llama-vocab.cpp, llama_vocab::impl::load).
PRE_TOKENIZERS: dict[str, PreTokenizerSpec] = {
    "default": PreTokenizerSpec(_DEFAULT),
    "llama3": _SPEC_LLAMA3,
    "llama-v3": _SPEC_LLAMA3,
    "llama-bpe": _SPEC_LLAMA3,
    "dbrx": _SPEC_LLAMA3_REGEX_ONLY,
    "smaug-bpe": _SPEC_LLAMA3_REGEX_ONLY,
    "gpt-2": _SPEC_GPT2,
    "phi-2": _SPEC_GPT2,
    "mpt": _SPEC_GPT2,
    "olmo": _SPEC_GPT2,
    "qwen2": _SPEC_QWEN2,
    "deepseek-r1-qwen": _SPEC_QWEN2,
    "stablelm2": PreTokenizerSpec((_QWEN2,)),
    "smollm": PreTokenizerSpec((r"\p{N}", _GPT2), clean_spaces=False),
    "starcoder": _SPEC_DIGITS_GPT2,
    "refact": _SPEC_DIGITS_GPT2,
    "codeshell": _SPEC_DIGITS_GPT2,
}


class GGUFTokenizerError(ValueError):
    """The GGUF's tokenizer cannot be rebuilt faithfully."""


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable character table, the alphabet byte-level vocabularies use.
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_ALPHABET = _bytes_to_unicode()
_ALPHABET_CHARS = frozenset(_BYTE_ALPHABET.values())


def pre_tokenizer_spec(pre: str | None) -> PreTokenizerSpec:
    # llama.cpp falls back to "default" (with a loud warning) when the key is missing; so do we.
    name = "default" if not pre else pre
    spec = PRE_TOKENIZERS.get(name)
    if spec is None:
        raise GGUFTokenizerError(
            f"unsupported tokenizer.ggml.pre {name!r}; supported: {', '.join(sorted(PRE_TOKENIZERS))}")
    return spec


def build_tokenizer(meta: dict[str, Any]) -> tuple[Tokenizer, dict[str, Any]]:
    """`(tokenizer, tokenizer_config)` for the vocabulary described by GGUF metadata `meta`."""
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFTokenizerError(f"unsupported tokenizer.ggml.model {model!r} (only 'gpt2', byte-level BPE)")
    spec = pre_tokenizer_spec(meta.get("tokenizer.ggml.pre"))
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise GGUFTokenizerError(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    vocab = _vocab(tokens, types)
    merges = _merges(meta.get("tokenizer.ggml.merges") or [])
    bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=spec.ignore_merges, fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in spec.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    _add_special_tokens(tok, tokens, types)

    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", spec.add_bos))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    special = {name: _token_at(tokens, meta, key) for name, key in _SPECIAL_KEYS.items()}
    tok.post_processor = _post_processor(add_bos, add_eos, meta, tokens)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": spec.clean_spaces,
        "model_max_length": int(meta.get(f"{meta.get('general.architecture')}.context_length", 0)) or None,
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    return tok, config


_SPECIAL_KEYS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


def _token_at(tokens: list[str], meta: dict[str, Any], key: str) -> str | None:
    token_id = meta.get(key)
    if token_id is None:
        return None
    if not 0 <= int(token_id) < len(tokens):
        raise GGUFTokenizerError(f"{key} = {token_id} is outside the vocabulary of {len(tokens)} tokens")
    return tokens[int(token_id)]


def _vocab(tokens: list[str], types: list[int]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    spelled = set(tokens)
    for index, (token, token_type) in enumerate(zip(tokens, types)):
        # A normal token must be spelled in the byte alphabet for BPE to ever produce it; a few
        # converters store such tokens as raw text, so re-spell those (as transformers does).
        if token_type == TOKEN_NORMAL and not set(token) <= _ALPHABET_CHARS:
            respelled = "".join(_BYTE_ALPHABET[b] for b in token.encode("utf-8"))
            if respelled not in spelled:
                token = respelled
        if token in vocab:
            raise GGUFTokenizerError(
                f"token {token!r} appears twice in tokenizer.ggml.tokens (ids {vocab[token]}, {index})")
        vocab[token] = index
    return vocab


def _merges(raw: list[str]) -> list[tuple[str, str]]:
    merges = []
    for line in raw:
        parts = line.split(" ")
        if len(parts) != 2:
            raise GGUFTokenizerError(f"tokenizer.ggml.merges entry {line!r} is not two space-separated tokens")
        merges.append((parts[0], parts[1]))
    return merges


def _add_special_tokens(tok: Tokenizer, tokens: list[str], types: list[int]) -> None:
    # llama.cpp matches control, user-defined and unknown tokens whole before pre-tokenizing
    # (tokenizer_st_partition); added tokens do the same here. Control tokens are "special"
    # (dropped by skip_special_tokens); user-defined ones such as <think> stay visible, as in HF.
    special = [AddedToken(t, special=True, normalized=False)
               for t, ty in zip(tokens, types) if ty in (TOKEN_CONTROL, TOKEN_UNKNOWN)]
    plain = [AddedToken(t, special=False, normalized=False)
             for t, ty in zip(tokens, types) if ty == TOKEN_USER_DEFINED]
    tok.add_special_tokens(special)
    tok.add_tokens(plain)
    for index, (token, token_type) in enumerate(zip(tokens, types)):
        if token_type in (TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED) and tok.token_to_id(token) != index:
            raise GGUFTokenizerError(f"added token {token!r} did not keep its id {index}")


def _post_processor(add_bos: bool, add_eos: bool, meta: dict[str, Any], tokens: list[str]) -> Any:
    if not (add_bos or add_eos):
        # Offsets only; adds no tokens.
        return processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    bos = _required_special(meta, tokens, "tokenizer.ggml.bos_token_id", "add_bos_token") if add_bos else None
    eos = _required_special(meta, tokens, "tokenizer.ggml.eos_token_id", "add_eos_token") if add_eos else None

    def segment(seq: str, type_id: int) -> list[str]:
        head = [f"{bos[0]}:{type_id}"] if bos else []
        tail = [f"{eos[0]}:{type_id}"] if eos else []
        return [*head, f"{seq}:{type_id}", *tail]

    used = dict(t for t in (bos, eos) if t is not None)
    return processors.TemplateProcessing(
        single=segment("$A", 0), pair=segment("$A", 0) + segment("$B", 1), special_tokens=list(used.items()))


def _required_special(meta: dict[str, Any], tokens: list[str], key: str, flag: str) -> tuple[str, int]:
    token = _token_at(tokens, meta, key)
    if token is None:
        raise GGUFTokenizerError(f"tokenizer.ggml.{flag} is true but {key} is missing")
    return token, int(meta[key])
