"""`--speculative-config JSON`: which speculative decoding runs, with vLLM's names for the same settings.

  {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": a, "prompt_lookup_max": b}
  {"method": "draft_model", "model": PATH, "num_speculative_tokens": k}

As in vLLM: the n-gram window defaults to 5..5 when neither bound is given, and one bound given alone
sets the other. Anything else (an unknown method or key, a bound out of range) is a startup error that
names the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

METHODS = ("ngram", "draft_model")
MAX_SPECULATIVE_TOKENS = 16  # each verification step feeds k + 1 rows per sequence
NGRAM_DEFAULT_WINDOW = 5
_KEYS = {"ngram": {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"},
         "draft_model": {"method", "num_speculative_tokens", "model"}}


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 0  # ngram only: the shortest suffix that may match
    prompt_lookup_max: int = 0  # ngram only: the longest suffix tried first
    model: str | None = None  # draft_model only: an HF-format directory sharing the target's tokenizer

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative config: method must be one of {', '.join(METHODS)}, got {self.method!r}")
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"speculative config: num_speculative_tokens must be an integer from 1 to "
                             f"{MAX_SPECULATIVE_TOKENS}, got {k!r}")
        if self.method == "ngram":
            for name in ("prompt_lookup_min", "prompt_lookup_max"):
                value = getattr(self, name)
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise ValueError(f"speculative config: {name} must be an integer >= 1, got {value!r}")
            if self.prompt_lookup_min > self.prompt_lookup_max:
                raise ValueError(f"speculative config: prompt_lookup_min ({self.prompt_lookup_min}) exceeds "
                                 f"prompt_lookup_max ({self.prompt_lookup_max})")
        elif not isinstance(self.model, str) or not (Path(self.model) / "config.json").is_file():
            raise ValueError(f"speculative config: draft_model needs \"model\", a checkpoint directory with a "
                             f"config.json sharing the target's tokenizer; got {self.model!r}")

    def describe(self) -> str:
        if self.method == "ngram":
            return (f"ngram (prompt lookup {self.prompt_lookup_min}..{self.prompt_lookup_max} tokens, "
                    f"{self.num_speculative_tokens} speculative tokens)")
        return f"draft_model {self.model} ({self.num_speculative_tokens} speculative tokens)"


def parse_speculative_config(text: str | None) -> SpeculativeConfig | None:
    """The flag's JSON text -> a checked config (None for no flag); ValueError names what is wrong."""
    if text is None or not text.strip():
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--speculative-config is not valid JSON: {e}") from e
    return speculative_config_from_dict(raw)


def speculative_config_from_dict(raw) -> SpeculativeConfig:
    if not isinstance(raw, dict):
        raise ValueError("--speculative-config must be a JSON object, e.g. "
                         '{"method": "ngram", "num_speculative_tokens": 4}')
    method = raw.get("method")
    if method not in METHODS:
        raise ValueError(f"speculative config: method must be one of {', '.join(METHODS)}, got {method!r}")
    unknown = sorted(set(raw) - _KEYS[method])
    if unknown:
        raise ValueError(f"speculative config: unknown key(s) for method {method}: {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(_KEYS[method]))})")
    if "num_speculative_tokens" not in raw:
        raise ValueError("speculative config: num_speculative_tokens is required")
    fields = dict(raw)
    if method == "ngram":
        lo, hi = raw.get("prompt_lookup_min"), raw.get("prompt_lookup_max")
        if lo is None and hi is None:
            lo = hi = NGRAM_DEFAULT_WINDOW
        fields["prompt_lookup_min"] = hi if lo is None else lo
        fields["prompt_lookup_max"] = lo if hi is None else hi
    return SpeculativeConfig(**fields)
