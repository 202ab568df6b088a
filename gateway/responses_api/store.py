"""Stored responses, for the Responses API's conversation state: a response made with `store` (OpenAI's default,
true) is kept, so that a later request can continue it with `previous_response_id`, and GET
/v1/responses/{id}, GET /v1/responses/{id}/input_items and DELETE /v1/responses/{id} can read or drop it.

What a response continues from is the conversation it was made from: every earlier turn's items, then its own
request's input, then its output items. `instructions` are not carried over, as in OpenAI's API: each request
states its own. The store is the gateway's memory, bounded in bytes (`--responses-store-buffer`): past the bound
the response read least recently goes first. A stored response belongs to the credentials that made it; any
other caller is told it does not exist. Behind a router that spreads requests over several servers, a
conversation continues only on the server that stored it (route by session).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

# The id prefix of an input item that came without an id, by its type (GET .../input_items lists every item by id).
_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


@dataclass(frozen=True)
class StoredResponse:
    owner: str  # a digest of the credentials that made it
    response: dict[str, Any]  # the response object, as it was returned
    input_items: list[dict[str, Any]]  # earlier turns' items, then this request's input, each with an id
    size: int  # bytes, as JSON

    def conversation(self) -> list[dict[str, Any]]:
        """The items a follow-up continues: the input items, then this response's output."""
        return self.input_items + self.response["output"]


class ResponseStore:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()  # least recently read first

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, credentials: str, response: dict[str, Any], input_items: list[dict[str, Any]]) -> None:
        items = [with_id(item) for item in input_items]
        size = len(json.dumps(response, ensure_ascii=False)) + len(json.dumps(items, ensure_ascii=False))
        if size > self.max_bytes:
            return  # larger than the whole store: kept it would evict everything, and still not fit
        self._entries[response["id"]] = StoredResponse(_owner(credentials), response, items, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self.bytes -= dropped.size

    def get(self, response_id: str, credentials: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is None or entry.owner != _owner(credentials):
            return None
        self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str, credentials: str) -> bool:
        if self.get(response_id, credentials) is None:
            return False
        self.bytes -= self._entries.pop(response_id).size
        return True


def with_id(item: dict[str, Any]) -> dict[str, Any]:
    """The item with an id of its own (a message sent as {"role", "content"} has none), and its type named."""
    kind = item.get("type") or "message"
    if item.get("id") and item.get("type"):
        return item
    return {**item, "type": kind, "id": item.get("id") or f"{_ID_PREFIXES.get(kind, 'item')}_{secrets.token_hex(12)}"}


def _owner(credentials: str) -> str:
    return hashlib.sha256(credentials.encode()).hexdigest()
