"""Several API keys against the real server: weighted-fair admission between keys (one key flooding the
queue does not starve another), per-key concurrency limits (429 with Retry-After), per-key metrics, and
authentication with a keys file beside --api-key.

The server runs at most two sequences at once, so a flood of requests with sixteen choices each queues
for many seconds.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx2
import openai
import pytest

from loadtest.fixtures.probes import metric_total
from tests.helpers.server import Server
from tests.integration.conftest import SERVED_NAME

KEYS = {"flood": "sk-flood-0123456789", "light": "sk-light-abcdef", "capped": "sk-capped-42"}
SINGLE_KEY = "sk-single-flag"
KEYS_FILE = f"""# tenants of the fair-queueing tests
{KEYS['flood']}   name=flood
{KEYS['light']}   name=light   weight=1
{KEYS['capped']}  name=capped  max_concurrent=1   # one request in flight at most
"""
# Two requests of sixteen 24-token choices: thirty-two sequences through two slots, sixteen waves.
FLOOD = {"model": SERVED_NAME, "prompt": "the flood", "max_tokens": 24, "ignore_eos": True, "temperature": 0,
         "n": 16}
LIGHT = {"model": SERVED_NAME, "prompt": "a short question", "max_tokens": 4, "ignore_eos": True, "temperature": 0}


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name] if name in KEYS else name}"}


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fair")
    (folder / "keys.txt").write_text(KEYS_FILE)
    srv = Server(tiny_model_dir, "--served-model-name", SERVED_NAME, "--num-kv-blocks", "256", "--max-num-seqs", "2",
                 "--max-num-batched-tokens", "128", "--api-keys-file", str(folder / "keys.txt"),
                 "--api-key", SINGLE_KEY, "--sse-ping-interval", "0.2", log_path=folder / "server.log").start()
    yield srv
    srv.stop()


def metrics_text(server) -> str:
    return httpx2.get(f"{server.url}/metrics", headers=auth("light"), timeout=10).text


def metric(server, name: str, **labels: str) -> float:
    return metric_total(metrics_text(server), name, **labels)


def wait_idle(server, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while metric(server, "mili_requests_running") or metric(server, "mili_requests_waiting") \
            or metric(server, "mili_api_key_requests_in_flight"):
        assert time.monotonic() < deadline, "the server is still busy after its clients left"
        time.sleep(0.1)


async def first_token_and_end(client: httpx2.AsyncClient, key: str, body: dict,
                              start: float) -> tuple[float, float]:
    """Stream a request; seconds from `start` to its first token and to its end."""
    first = None
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}, headers=auth(key)) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if first is None and line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                first = time.monotonic() - start
    return first, time.monotonic() - start


async def flood_then_light(server, light_key: str, wait_for_flood: bool) -> dict[str, float]:
    """Two flood requests fill the queue; then one light request arrives with `light_key`. Seconds from the
    flood's start: the light request's first token and end, and the flood's first request's end (inf when
    not waited for: it is cancelled once the light request is done)."""
    async with httpx2.AsyncClient(base_url=server.url, timeout=300) as client:
        start = time.monotonic()
        flood = [asyncio.create_task(client.post("/v1/completions", json=FLOOD, headers=auth("flood")))
                 for _ in range(2)]
        flood_done: list[float] = []
        for task in flood:
            task.add_done_callback(lambda _: flood_done.append(time.monotonic() - start))
        while metric(server, "mili_requests_waiting") < 20:  # both flood requests are in: 2 run, 30 wait
            assert time.monotonic() - start < 60, "the flood never queued"
            await asyncio.sleep(0.01)
        light_sent = time.monotonic() - start
        ttft, light_done = await first_token_and_end(client, light_key, LIGHT, start)
        flood_first_done = min(flood_done, default=float("inf"))
        if wait_for_flood:
            responses = await asyncio.gather(*flood)
            assert all(r.status_code == 200 and len(r.json()["choices"]) == 16 for r in responses)
            flood_first_done = min(flood_done)
        else:
            for task in flood:
                task.cancel()  # the connections close: the worker drops the flood
            await asyncio.gather(*flood, return_exceptions=True)
    return {"light_sent": light_sent, "light_ttft": ttft, "light_done": light_done,
            "flood_first_done": flood_first_done}


def test_a_flooding_key_does_not_starve_another(server):
    """With its own key the light request is admitted at the next free slot and ends before any of the
    flood's requests; sent with the flood's key (one tenant: FCFS, the control) the same request waits
    behind the whole flood."""
    fair = asyncio.run(flood_then_light(server, "light", wait_for_flood=False))
    wait_idle(server)
    fcfs = asyncio.run(flood_then_light(server, "flood", wait_for_flood=True))
    wait_idle(server)
    print(f"\nown key: {fair}\nflood's key (FCFS): {fcfs}")
    # Orderings, not durations: the machine's speed changes every duration, never the order.
    assert fair["flood_first_done"] == float("inf"), f"the light request ended after a flood request: {fair}"
    assert fcfs["light_ttft"] > fcfs["flood_first_done"], f"FCFS should starve it: {fcfs}"


def test_a_key_over_its_limit_gets_429_and_its_place_comes_back(server):
    rejected_before = metric(server, "mili_api_key_requests_rejected_total", key="capped")
    # Sixteen long choices through two slots: in flight for seconds even on a fast machine.
    long = {**LIGHT, "max_tokens": 400, "n": 16, "stream": True}
    with httpx2.stream("POST", f"{server.url}/v1/completions", json=long, headers=auth("capped"), timeout=60) as held:
        assert held.status_code == 200
        lines = held.iter_lines()  # kept: dropping the iterator would close the connection
        next(lines)  # admitted and streaming
        assert metric(server, "mili_api_key_requests_in_flight", key="capped") == 1
        r = httpx2.post(f"{server.url}/v1/completions", json=LIGHT, headers=auth("capped"), timeout=60)
        assert r.status_code == 429
        error = r.json()["error"]
        assert error["code"] == "rate_limit_exceeded" and error["type"] == "rate_limit_error", error
        assert "at most 1 requests in flight" in error["message"]
        assert int(r.headers["Retry-After"]) >= 1
        # Other keys are not held back by it.
        other = httpx2.post(f"{server.url}/v1/completions", json=LIGHT, headers=auth("light"), timeout=60)
        assert other.status_code == 200
        with pytest.raises(openai.RateLimitError):
            openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEYS["capped"], max_retries=0).completions.create(
                model=SERVED_NAME, prompt="hi", max_tokens=2)
        assert next(lines) is not None  # the held stream ran on throughout
    assert metric(server, "mili_api_key_requests_rejected_total", key="capped") == rejected_before + 2
    deadline = time.monotonic() + 10  # the held stream was closed: its place comes back
    while metric(server, "mili_api_key_requests_in_flight", key="capped"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    r = httpx2.post(f"{server.url}/v1/completions", json=LIGHT, headers=auth("capped"), timeout=60)
    assert r.status_code == 200


def test_keys_from_the_file_and_the_flag_work_and_others_get_401(server):
    for key in (*KEYS.values(), SINGLE_KEY):
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=60)
        reply = client.completions.create(model=SERVED_NAME, prompt="hi", max_tokens=4, extra_body={"ignore_eos": True})
        assert reply.usage.completion_tokens == 4
    for header in ({"Authorization": "Bearer sk-unknown"}, {"Authorization": KEYS["light"]}, {}):
        r = httpx2.post(f"{server.url}/v1/completions", json=LIGHT, headers=header, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx2.get(f"{server.url}/health").status_code == 200


def test_per_key_metrics_name_keys_never_secrets(server):
    admitted = {name: metric(server, "mili_api_key_requests_admitted_total", key=name)
                for name in ("flood", "light", "capped", "default")}
    for name in admitted:
        r = httpx2.post(f"{server.url}/v1/completions", json=LIGHT,
                        headers=auth(name if name != "default" else SINGLE_KEY), timeout=60)
        assert r.status_code == 200
    text = metrics_text(server)
    for name, before in admitted.items():
        assert metric(server, "mili_api_key_requests_admitted_total", key=name) == before + 1
        assert f'key="{name}"' in text
    assert not any(secret in text for secret in (*KEYS.values(), SINGLE_KEY))
    assert server.log_path.read_text().count("sk-") == 0, "a secret reached the log"


def test_resumable_streams_end_their_keys_count(tiny_model_dir, tmp_path):
    """With --stream-resume-ttl the generation outlives its connection; a stream that ends on its own must
    still end its count against the key's max_concurrent, or the key's next request is refused."""
    (tmp_path / "keys.txt").write_text(KEYS_FILE)
    srv = Server(tiny_model_dir, "--served-model-name", SERVED_NAME, "--num-kv-blocks", "256",
                 "--api-keys-file", str(tmp_path / "keys.txt"), "--stream-resume-ttl", "30",
                 log_path=tmp_path / "server.log").start()
    try:
        for _ in range(3):
            with httpx2.stream("POST", f"{srv.url}/v1/completions", json={**LIGHT, "stream": True},
                               headers=auth("capped"), timeout=30) as r:
                assert r.status_code == 200, r.read()
                assert r.headers["x-stream-id"]
                lines = list(r.iter_lines())
            assert "data: [DONE]" in lines
        wait_idle(srv)
    finally:
        srv.stop()
