"""`mili serve --kv-cache-dtype int8` end to end: real gateway and worker processes over real sockets.
Greedy output does not depend on the batch, GET /debug/kv and the KV self-check keep working over an
int8 cache, and the worker logs the cache dtype it allocated."""

from __future__ import annotations

import asyncio

import httpx2
import pytest

from tests.helpers.server import Server
from tests.integration.conftest import SERVED_NAME
from tests.integration.streams.test_disconnect import wait_idle
from tests.integration.workers.test_kv_self_check import VIOLATIONS, assert_totals_add_up, ledger, wait_violations

GREEDY = {"model": SERVED_NAME, "max_tokens": 48, "ignore_eos": True, "temperature": 0}
PROMPTS = ["the quick brown fox", "a b c d e f g h i j k l m n o p " * 6, "one two three", "lorem ipsum " * 20]


@pytest.fixture(scope="module")
def int8_server(tiny_model_dir, tmp_path_factory):
    # Small prefill chunks, so the concurrent requests' prompts share steps with the others' decodes. Weights in
    # q8_0: MILI's quantized matmuls give a row the same bits at any row count, as the int8 cache does; torch's
    # float32 linear does not (its rows can differ in the last bit between 3 and 32 rows, and a row's int8 scale
    # then differs too, which can part the greedy paths).
    srv = Server(tiny_model_dir, "--served-model-name", SERVED_NAME, "--kv-cache-dtype", "int8",
                 "--quantization", "q8_0", "--num-kv-blocks", "256", "--max-num-batched-tokens", "32",
                 "--enable-debug-faults",
                 log_path=tmp_path_factory.mktemp("kv-int8") / "server.log").start()
    yield srv
    srv.stop()


def complete(client, prompt: str):
    return client.post("/v1/completions", json={**GREEDY, "prompt": prompt})


def test_int8_server_is_batch_invariant_and_its_kv_checks_work(int8_server):
    assert "in torch.int8" in int8_server.log_path.read_text()  # the engine's startup line names the cache dtype
    with httpx2.Client(base_url=int8_server.url, timeout=60) as client:
        alone = []
        for p in PROMPTS:
            r = complete(client, p)
            assert r.status_code == 200, r.text
            alone.append(r.json()["choices"][0]["text"])

    async def together():
        async with httpx2.AsyncClient(base_url=int8_server.url, timeout=60) as client:
            replies = await asyncio.gather(*(complete(client, p) for p in PROMPTS))
        return [r.json()["choices"][0]["text"] for r in replies]

    assert asyncio.run(together()) == alone
    # The KV self-check audits the int8 cache's blocks as any other: a leaked block is found and repaired.
    r = httpx2.post(f"{int8_server.url}/debug/kv/fault", json={"kind": "leak"}, timeout=30)
    assert r.status_code == 200, r.text
    with httpx2.Client(base_url=int8_server.url, timeout=60) as client:
        assert complete(client, PROMPTS[0]).json()["choices"][0]["text"] == alone[0]
    wait_violations(int8_server, 1)
    wait_idle(int8_server)
    led = ledger(int8_server)
    assert led["totals"]["used"] == 0 and led["requests"] == {}
    assert_totals_add_up(led)
    assert led["audit"]["violations"] == 1
