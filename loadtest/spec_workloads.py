"""The speculative decoding benchmarks' workloads and models, shared by loadtest/bench_spec.py (in process)
and loadtest/bench_spec_serve.py (over HTTP, against llama-server):

  grounded:   rewrite a 300-600-word text given in the prompt (the output quotes the input);
  open-ended: write a story (nothing to look up).
"""

from __future__ import annotations

from pathlib import Path

from shared.default_model import converted_gguf, default_gguf_path, default_model_path

DEFAULT_SPEC = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 4}

_SENTENCES = [
    "The harbour town woke slowly, its fishing boats rocking against the stone quay while gulls argued overhead.",
    "Every morning the baker opened her shutters at six and set out loaves that were still warm from the oven.",
    "Down the lane, the old clockmaker adjusted the hands of a tower clock that had not kept time for years.",
    "Children ran between the market stalls, weaving past crates of apples, pears and bright orange squash.",
    "The council had promised a new road to the valley, but the surveyors had not yet arrived with their maps.",
    "In the library, a retired teacher catalogued letters written by sailors who had left the town long ago.",
    "Each letter described storms, distant ports, and the longing to return to the quiet streets of home.",
    "When the autumn fair came, the square filled with music, lanterns and the smell of roasted chestnuts.",
    "Visitors from the city admired the painted houses and asked how the town had kept its old character.",
    "The answer, the mayor liked to say, was patience: nothing here was ever done in a hurry.",
]


def grounded_prompt(i: int, words: int = 400) -> str:
    """A text of about `words` words (a rotation of the sentences, so each request differs) to rewrite."""
    rotated = _SENTENCES[i % len(_SENTENCES):] + _SENTENCES[:i % len(_SENTENCES)]
    text, sentences = [], 0
    while sum(len(s.split()) for s in text) < words:
        text.append(rotated[sentences % len(rotated)])
        sentences += 1
    return ("Rewrite the following text, keeping every sentence but changing 'town' to 'village'. "
            "Output only the rewritten text.\n\n" + " ".join(text))


def open_prompt(i: int) -> str:
    topics = ["a dragon who is afraid of heights", "a robot learning to paint", "two friends lost in a forest",
              "a lighthouse keeper and a storm", "a cat who becomes mayor", "the last train of the night"]
    return f"Write a short story about {topics[i % len(topics)]}."


WORKLOADS = {"grounded": grounded_prompt, "open-ended": open_prompt}


def chat_text(tokenizer, workload: str, i: int) -> str:
    """Request i of a workload as the model's chat template renders it (what both engines are sent)."""
    return tokenizer.apply_chat_template([{"role": "user", "content": WORKLOADS[workload](i)}],
                                         add_generation_prompt=True, tokenize=False)


def model_dir(model: Path | None) -> Path:
    """The HF-format directory the engine loads for --model (a .gguf is converted once, into the cache)."""
    if model is None:
        return default_model_path()
    return converted_gguf(model, model.stem) if model.suffix == ".gguf" else model


def model_gguf(model: Path | None) -> Path:
    """The .gguf file the servers load for --model (default: the default model's)."""
    if model is None:
        return default_gguf_path()
    if model.suffix != ".gguf":
        raise SystemExit(f"--http needs a .gguf file (llama-server reads only GGUF), got {model}")
    return model
