"""Stored Responses API responses (gateway/responses_api/store.py): the conversation a follow-up continues, ids for
every input item, the byte bound (least recently read first out), and each caller seeing only its own."""

from __future__ import annotations

import json

import pytest

from gateway.openai.parse import Limits
from gateway.responses_api.routes import _earlier
from gateway.responses_api.store import ResponseStore
from gateway.responses_api.to_chat import parse_responses
from gateway.server.errors import ApiError

ME, SOMEONE = "Bearer sk-me", "Bearer sk-someone"


def response(n: int, text: str = "hello") -> dict:
    return {"id": f"resp_{n}", "object": "response", "status": "completed", "output": [
        {"type": "message", "id": f"msg_out{n}", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": text, "annotations": []}]}]}


def test_the_conversation_is_the_input_then_the_output_and_every_item_has_an_id():
    store = ResponseStore(1 << 20)
    store.put(ME, response(1), [{"role": "user", "content": "hi"}, {"type": "function_call_output", "call_id": "c",
                                                                     "output": "ok", "id": "fco_mine"}])
    conversation = store.get("resp_1", ME).conversation()
    assert [item["type"] for item in conversation] == ["message", "function_call_output", "message"]
    assert conversation[0]["id"].startswith("msg_") and conversation[1]["id"] == "fco_mine"
    assert conversation[2]["id"] == "msg_out1"


def test_a_follow_up_runs_on_the_earlier_turns_then_its_input():
    store = ResponseStore(1 << 20)
    first = parse_responses({"model": "m", "input": "My name is Ada.", "instructions": "Be brief."}, Limits(),
                            can_store=True)
    assert first.store
    store.put(ME, response(1, "Hello Ada."), first.input_items)
    raw = {"model": "m", "input": "What is my name?", "previous_response_id": "resp_1"}
    follow = parse_responses(raw, Limits(), _earlier(raw, store, ME), can_store=True)
    assert follow.chat.messages == ({"role": "user", "content": "My name is Ada."},
                                    {"role": "assistant", "content": "Hello Ada."},
                                    {"role": "user", "content": "What is my name?"})  # no earlier instructions
    assert len(follow.input_items) == 3
    assert not parse_responses({"model": "m", "input": "x", "store": False}, Limits(), can_store=True).store
    assert not parse_responses({"model": "m", "input": "x"}, Limits(), can_store=False).store


def test_unknown_ids_and_a_server_that_keeps_nothing_are_refused():
    store = ResponseStore(1 << 20)
    store.put(ME, response(1), [{"role": "user", "content": "hi"}])
    with pytest.raises(ApiError) as e:
        _earlier({"previous_response_id": "resp_1"}, store, SOMEONE)  # another caller's: not there for it
    assert (e.value.status, e.value.code, e.value.param) == (404, "previous_response_not_found",
                                                             "previous_response_id")
    with pytest.raises(ApiError) as e:
        _earlier({"previous_response_id": "resp_1"}, None, ME)
    assert e.value.status == 400 and "keeps none" in e.value.message
    assert _earlier({"previous_response_id": 5}, store, ME) == []  # the body's validation names the field


def test_the_bound_drops_the_least_recently_read_first():
    items = [{"role": "user", "content": "x" * 100}]
    size = len(json.dumps(response(0))) + len(json.dumps([{"type": "message", "id": "msg_" + "0" * 24, **items[0]}]))
    store = ResponseStore(3 * size)
    for n in range(3):
        store.put(ME, response(n), items)
    assert len(store) == 3 and store.bytes == 3 * size
    assert store.get("resp_0", ME) is not None  # read: now the most recent
    store.put(ME, response(3), items)
    assert store.get("resp_1", ME) is None and store.get("resp_0", ME) is not None and len(store) == 3
    assert store.bytes <= store.max_bytes
    store.put(ME, response(4, "y" * (4 * size)), items)  # larger than the whole store: not kept, nothing dropped
    assert store.get("resp_4", ME) is None and len(store) == 3


def test_delete_is_the_owners_alone():
    store = ResponseStore(1 << 20)
    store.put(ME, response(1), [])
    assert not store.delete("resp_1", SOMEONE) and store.get("resp_1", ME) is not None
    assert store.delete("resp_1", ME) and store.get("resp_1", ME) is None and store.bytes == 0
    assert not store.delete("resp_1", ME)
