"""The bounds on compiling a request's grammar, each exercised: llguidance's fuel and size limits (the same
in the gateway's check and the worker's compile) and the gateway's limit on compile time. Real schemas of
requests' sizes stay well inside the real limits (they compile in tenths of a second), so the limits are
lowered here to meet them, which shows the limits are the ones applied."""

from __future__ import annotations

import asyncio

import pytest
from tokenizers import Tokenizer

from gateway.server.errors import ApiError
from gateway.text import grammars
from gateway.text.grammars import GrammarChecker, ResponseFormat, build_grammar, response_format_rules
from shared import grammar_limits
from shared.default_model import default_model_path
from worker.runner.structured_output import GrammarCompiler, GrammarError

# 300 integer properties with wide ranges: a legitimate schema whose compile takes measurable time.
WIDE = {"type": "object", "additionalProperties": False,
        "properties": {f"n{i}": {"type": "integer", "minimum": -123456789 * i - 7, "maximum": 987654321 * i + 13}
                       for i in range(300)}}


def grammar(schema: dict) -> str:
    return build_grammar(response_format_rules(ResponseFormat(schema, strict=True)), "none")


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))


def check(tokenizer: Tokenizer, schema: dict) -> None:
    asyncio.run(GrammarChecker(tokenizer).check(grammar(schema), "response_format.json_schema.schema"))


def test_a_wide_schema_passes_the_real_limits(tokenizer):
    check(tokenizer, WIDE)


def test_a_compile_over_the_time_limit_is_a_400(tokenizer, monkeypatch):
    monkeypatch.setattr(grammars, "MAX_COMPILE_SECONDS", 0.0)
    with pytest.raises(ApiError) as raised:
        check(tokenizer, WIDE)
    assert raised.value.status == 400 and raised.value.param == "response_format.json_schema.schema"
    assert "to compile (the limit is 0.0 s)" in raised.value.message


@pytest.mark.parametrize("limit, value, says", [("max_grammar_size", 2_000, "grammar size"),
                                                ("initial_lexer_fuel", 100, "too big")])
def test_a_grammar_over_a_parser_limit_is_refused_by_gateway_and_worker(tokenizer, monkeypatch, limit, value, says):
    monkeypatch.setitem(grammar_limits.PARSER_LIMITS, limit, value)
    with pytest.raises(ApiError) as raised:
        check(tokenizer, WIDE)
    message = raised.value.message
    assert raised.value.status == 400 and "not supported" in message and says in message
    assert len(message) < 700 and '"n299"' not in message  # llguidance's listing of the schema is left out
    compiler = GrammarCompiler(default_model_path(), tokenizer.get_vocab_size(), [0])
    with pytest.raises(GrammarError):
        compiler.sequence_grammar(grammar(WIDE))
