"""Raw SSE reading for framing tests: what a `curl -N` user sees, line by line."""

from __future__ import annotations

import json

import httpx2


def stream_lines(url: str, body: dict, headers: dict | None = None, timeout: float = 60) -> tuple[int, list[str]]:
    """POST and return the status and every line of the response body as it arrived."""
    with httpx2.stream("POST", url, json=body, headers=headers, timeout=timeout) as r:
        return r.status_code, list(r.iter_lines())


def data_payloads(lines: list[str]) -> list[str]:
    return [line[len("data: "):] for line in lines if line.startswith("data: ")]


def chunks(lines: list[str]) -> list[dict]:
    """The JSON chunks of a stream, checking the framing: `data: ` lines separated by blank lines, and
    `data: [DONE]` last."""
    payloads = data_payloads(lines)
    assert payloads and payloads[-1] == "[DONE]", lines[-5:]
    assert "[DONE]" not in payloads[:-1]
    for line in lines:
        assert line == "" or line.startswith(("data: ", ":")), f"unexpected SSE line {line!r}"
    return [json.loads(p) for p in payloads[:-1]]


def events(lines: list[str]) -> list[tuple[int | None, str]]:
    """The stream's events as (id, data) pairs, id None for an event without one (comments skipped)."""
    parsed, event_id, data = [], None, None
    for line in lines:
        if line.startswith("id: "):
            event_id = int(line[len("id: "):])
        elif line.startswith("data: "):
            data = line[len("data: "):]
        elif line == "" and data is not None:
            parsed.append((event_id, data))
            event_id, data = None, None
    if data is not None:
        parsed.append((event_id, data))
    return parsed
