"""A soak driver: many mixed requests against a running server, each one's outcome classified.

The mix: completions and chat, streaming or not, n from 1 to 3, stop strings, logprobs, a share of
invalid requests, and clients that drop their connection at a random moment. Every request runs under
a timeout; one that hits it is a hang. `kill_at` (a request count) runs a callback in the middle.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx2

REQUEST_TIMEOUT_S = 30.0


@dataclass
class Outcome:
    kind: str  # "ok", "bad_input", "dropped", "error_event", "503:<code>", "hang", "other:<detail>"
    submitted: float
    detail: str = ""


@dataclass
class SoakResult:
    outcomes: list[Outcome] = field(default_factory=list)
    kill_time: float | None = None

    def counts(self, after_kill: bool | None = None) -> Counter:
        chosen = [o for o in self.outcomes if after_kill is None or self.kill_time is None
                  or (o.submitted > self.kill_time) == after_kill]
        return Counter(o.kind for o in chosen)

    def unexpected(self, allowed: set[str]) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind not in allowed]


def _bad_inputs(model: str) -> list[tuple[str, object]]:
    """Requests the server must refuse with a 4xx and an error object."""
    comp = {"model": model, "prompt": "hello", "max_tokens": 4}
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return [
        ("/v1/completions", b'{"model": '),
        ("/v1/completions", {**comp, "model": "no-such-model"}),
        ("/v1/completions", {**comp, "prompt": ""}),
        ("/v1/completions", {**comp, "prompt": [1, 10**9]}),
        ("/v1/completions", {**comp, "temperature": 7}),
        ("/v1/completions", {**comp, "n": 0}),
        ("/v1/completions", {**comp, "max_tokens": -1}),
        ("/v1/completions", {**comp, "temprature": 0.5}),
        ("/v1/completions", {**comp, "logprobs": 99}),
        ("/v1/chat/completions", {**chat, "messages": [{"role": "wizard", "content": "x"}]}),
        ("/v1/chat/completions", {**chat, "top_logprobs": 3}),
        ("/v1/chat/completions", {"model": model}),
    ]


WORDS = "the a of and to in is it you that he was for on are with as I his they be at one have this".split()


def _good_request(rng: random.Random, model: str) -> tuple[str, dict]:
    n = rng.choice([1, 1, 2, 3])
    body: dict = {"model": model, "max_tokens": rng.randrange(1, 12), "n": n, "stream": rng.random() < 0.6,
                  "temperature": rng.choice([0, 0.7, 1.0]), "seed": rng.randrange(1000)}
    if rng.random() < 0.3:
        body["stop"] = rng.sample(WORDS, rng.randrange(1, 3))
    if rng.random() < 0.2:
        body["ignore_eos"] = True
    text = " ".join(rng.choices(WORDS, k=rng.randrange(1, 30)))
    if rng.random() < 0.5:
        body["prompt"] = text
        if rng.random() < 0.3:
            body["logprobs"] = rng.randrange(0, 3)
        return "/v1/completions", body
    body["messages"] = [{"role": "user", "content": text}]
    if rng.random() < 0.3:
        body["logprobs"] = True
        body["top_logprobs"] = rng.randrange(0, 3)
    if body["stream"] and rng.random() < 0.3:
        body["stream_options"] = {"include_usage": True}
    return "/v1/chat/completions", body


async def _one(client: httpx2.AsyncClient, rng: random.Random, model: str, submitted: float,
               bad_share: float, drop_share: float) -> Outcome:
    if rng.random() < bad_share:
        path, body = rng.choice(_bad_inputs(model))
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = await client.post(path, content=content, headers={"content-type": "application/json"})
        error = r.json().get("error", {}) if r.headers.get("content-type", "").startswith("application/json") else {}
        if 400 <= r.status_code < 500 and error.get("message"):
            return Outcome("bad_input", submitted)
        if r.status_code == 503 and error.get("code"):
            # Checking ids and lengths needs a live worker's vocabulary and context: sent as one is killed, a bad
            # input gets the 503 any request gets then.
            return Outcome(f"503:{error['code']}", submitted, r.text[:200])
        return Outcome(f"other:bad input answered {r.status_code}", submitted, r.text[:200])
    path, body = _good_request(rng, model)
    drop_after = rng.randrange(0, 6) if rng.random() < drop_share else None
    if not body["stream"]:
        if drop_after is None:
            r = await client.post(path, json=body)
        else:  # a client that gives up while waiting
            try:
                r = await asyncio.wait_for(client.post(path, json=body), timeout=rng.uniform(0.0, 0.3))
            except asyncio.TimeoutError:
                return Outcome("dropped", submitted)
        return _classify_response(r.status_code, r.text, body["n"], submitted)
    async with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            return _classify_response(r.status_code, (await r.aread()).decode(errors="replace"), 0, submitted)
        lines = 0
        events = []
        done = False
        async for line in r.aiter_lines():
            lines += 1
            if drop_after is not None and lines > drop_after:
                return Outcome("dropped", submitted)  # leaving the block closes the connection mid-stream
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                events.append(json.loads(line[6:]))
        return _classify_stream(events, done, body["n"], submitted)


def _classify_response(status: int, text: str, n: int, submitted: float) -> Outcome:
    if status == 200:
        choices = json.loads(text)["choices"]
        if len(choices) == n and all(c["finish_reason"] in ("stop", "length") for c in choices):
            return Outcome("ok", submitted)
        return Outcome("other:incomplete 200", submitted, text[:300])
    if status == 503:
        return Outcome(f"503:{json.loads(text)['error']['code']}", submitted)
    return Outcome(f"other:status {status}", submitted, text[:300])


def _classify_stream(events: list[dict], done: bool, n: int, submitted: float) -> Outcome:
    if not done:
        return Outcome("other:stream ended without [DONE]", submitted, json.dumps(events[-2:])[:300])
    if events and "error" in events[-1]:
        return Outcome("error_event", submitted, events[-1]["error"].get("code") or "")
    finished = {c["index"] for e in events for c in e.get("choices", []) if c.get("finish_reason")}
    if finished == set(range(n)):
        return Outcome("ok", submitted)
    return Outcome("other:stream without every finish_reason", submitted, json.dumps(events[-2:])[:300])


async def soak(url: str, model: str, total: int, seed: int, concurrency: int = 32, bad_share: float = 0.1,
               drop_share: float = 0.15, kill_at: int | None = None,
               kill: Callable[[], None] | None = None, after_kill: Callable[[], object] | None = None) -> SoakResult:
    """Run `total` requests, at most `concurrency` at once; after `kill_at` have been submitted, call
    `kill` and then (awaiting it if it is a coroutine) `after_kill` before submitting the rest."""
    rng = random.Random(seed)
    result = SoakResult()
    gate = asyncio.Semaphore(concurrency)
    limits = httpx2.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency)

    async with httpx2.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        async def run(submitted: float, request_rng: random.Random) -> None:
            try:
                outcome = await asyncio.wait_for(
                    _one(client, request_rng, model, submitted, bad_share, drop_share), REQUEST_TIMEOUT_S + 5)
            except (asyncio.TimeoutError, httpx2.TimeoutException):
                outcome = Outcome("hang", submitted)
            except Exception as e:  # a broken connection or body: recorded, never hidden
                outcome = Outcome(f"other:{type(e).__name__}", submitted, str(e)[:200])
            finally:
                gate.release()
            result.outcomes.append(outcome)

        tasks = []
        for i in range(total):
            if i == kill_at and kill is not None:
                kill()
                result.kill_time = time.monotonic()
                if after_kill is not None:
                    waited = after_kill()
                    if asyncio.iscoroutine(waited):
                        await waited
            await gate.acquire()
            # Stamped here: a task created before the kill may only start running after it.
            tasks.append(asyncio.create_task(run(time.monotonic(), random.Random(rng.randrange(2**32)))))
        await asyncio.gather(*tasks)
    return result
