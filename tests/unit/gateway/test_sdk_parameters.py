"""Every parameter the pinned SDKs' create methods send is a field MILI's bodies know: served, accepted with no
effect, or accepted only with the value that means "not used" (any other value a 400 naming the field as not
supported, never an "unrecognized request argument"). Anthropic's bodies ignore fields they do not know, as
Anthropic's API does, so only the OpenAI bodies are held to this."""

from __future__ import annotations

import inspect

import pytest
from openai.resources.chat.completions import Completions as ChatCompletions
from openai.resources.completions import Completions
from openai.resources.responses import Responses

from gateway.openai.parse import Limits, parse_chat
from gateway.openai.schema import ChatBody, CompletionBody
from gateway.responses_api.schema import ResponsesBody
from gateway.server.errors import ApiError

# What the SDK's methods take beyond the body.
TRANSPORT = {"self", "extra_headers", "extra_query", "extra_body", "timeout"}
M = "tiny"
LIMITS = Limits(max_n=4, max_stop=4, max_stop_length=32)
USER = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize("method,body", [(ChatCompletions.create, ChatBody), (Completions.create, CompletionBody),
                                         (Responses.create, ResponsesBody)])
def test_every_sdk_parameter_is_a_known_field(method, body):
    sent = set(inspect.signature(method).parameters) - TRANSPORT
    assert sent - set(body.model_fields) == set()


def test_chat_hints_are_accepted_and_unserved_values_named():
    hints = {"prompt_cache_key": "k", "safety_identifier": "u1", "prompt_cache_retention": "24h",
             "verbosity": "medium", "moderation": None, "prompt_cache_options": None}
    parse_chat({"model": M, "messages": USER, **hints}, LIMITS)
    for field, value in (("verbosity", "low"), ("moderation", {"model": "omni-moderation-latest"}),
                         ("prompt_cache_options", {"mode": "explicit"}), ("prompt_cache_retention", "forever")):
        with pytest.raises(ApiError) as e:
            parse_chat({"model": M, "messages": USER, field: value}, LIMITS)
        assert e.value.status == 400 and e.value.param == field
        assert "unrecognized" not in e.value.message

