"""llama.cpp /completion bodies as the completion requests they mean (gateway/llamacpp/to_completion.py): the parts
that need no server."""

from __future__ import annotations

from gateway.llamacpp.completion_schema import LlamaCompletionBody
from gateway.llamacpp.to_completion import completion_body


def _bias(logit_bias) -> dict[str, float]:
    body = LlamaCompletionBody.model_validate({"prompt": "hi", "logit_bias": logit_bias})
    return completion_body(body, "m", lambda text: [1000 + len(text)])["logit_bias"]


def test_a_logit_bias_token_in_ascii_digits_is_an_id_and_any_other_text_is_tokenized():
    """'²' and '٣' are digits to str.isdigit (int() refuses the first and reads the second as 3): both are text."""
    assert _bias({"17": 2.0, "²": 1.0}) == {"17": 2.0, "1001": 1.0}
    assert _bias([["٣", -1.0], [5, False], ["hey", 0.5]]) == {"1001": -1.0, "5": -100.0, "1003": 0.5}


def test_an_empty_grammar_is_no_grammar():
    """llama.cpp's web UI and other clients send "grammar": "" for none; llama-server runs them unconstrained."""
    translated = completion_body(LlamaCompletionBody.model_validate({"prompt": "hi", "grammar": ""}), "m", list)
    assert "grammar" not in translated
    given = completion_body(LlamaCompletionBody.model_validate({"prompt": "hi", "grammar": 'root ::= "a"'}), "m", list)
    assert given["grammar"] == 'root ::= "a"'
