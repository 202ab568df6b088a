"""llama.cpp /completion bodies as the completion requests they mean (gateway/llamacpp/to_completion.py): the parts
that need no server."""

from __future__ import annotations

import pytest

from gateway.llamacpp.completion_schema import LlamaCompletionBody
from gateway.llamacpp.to_completion import completion_body
from gateway.server.errors import ApiError


def _no_text(text: str, add_special: bool) -> list[int]:
    raise AssertionError("nothing to tokenize")


def _bias(logit_bias) -> dict[str, float]:
    body = LlamaCompletionBody.model_validate({"prompt": "hi", "logit_bias": logit_bias})
    return completion_body(body, "m", lambda text, add_special: [1000 + len(text)])["logit_bias"]


def test_a_logit_bias_token_in_ascii_digits_is_an_id_and_any_other_text_is_tokenized():
    """'²' and '٣' are digits to str.isdigit (int() refuses the first and reads the second as 3): both are text. So
    is a number with a leading zero, which no id is written as (the document's pattern for ids has none)."""
    assert _bias({"17": 2.0, "²": 1.0}) == {"17": 2.0, "1001": 1.0}
    assert _bias({"017": 2.0, "0": 1.0}) == {"1003": 2.0, "0": 1.0}
    assert _bias([["٣", -1.0], [5, False], ["hey", 0.5]]) == {"1001": -1.0, "5": -100.0, "1003": 0.5}


def test_an_empty_grammar_is_no_grammar():
    """llama.cpp's web UI and other clients send "grammar": "" for none; llama-server runs them unconstrained."""
    translated = completion_body(LlamaCompletionBody.model_validate({"prompt": "hi", "grammar": ""}), "m", _no_text)
    assert "grammar" not in translated
    body = LlamaCompletionBody.model_validate({"prompt": "hi", "grammar": 'root ::= "a"'})
    given = completion_body(body, "m", _no_text)
    assert given["grammar"] == 'root ::= "a"'


def test_token_ids_and_texts_mixed_are_one_prompt_and_texts_alone_are_refused():
    """llama-server's mixed prompt: each text tokenized alone, the first element with the tokenizer's leading special
    tokens; ids as they are. A list of texts alone is its several prompts: a 400 naming prompt."""
    def tokenize(text: str, add_special: bool) -> list[int]:
        return ([1] if add_special else []) + [100 + len(text)]

    def prompt(value):
        return completion_body(LlamaCompletionBody.model_validate({"prompt": value}), "m", tokenize)["prompt"]

    assert prompt("hi") == "hi" and prompt([5, 6]) == [5, 6]
    assert prompt(["ab", 7, "cde"]) == [1, 102, 7, 103]
    assert prompt([7, "ab"]) == [7, 102]
    with pytest.raises(ApiError) as e:
        prompt(["a", "b"])
    assert e.value.status == 400 and e.value.param == "prompt" and "several prompts" in e.value.message
