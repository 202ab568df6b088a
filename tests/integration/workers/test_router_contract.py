"""The router contract on a real server: vLLM-named aliases of MILI's own series (what the GAIE / llm-d
endpoint picker and SMG read), and X-Request-Id.

The aliases must equal MILI's series in the same scrape, under load as well as idle, carry the
`model_name` label, and keep their Prometheus types; a scrape stays cheap (printed, not asserted).
"""

from __future__ import annotations

import asyncio
import time

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.server import Server
from tests.integration.conftest import SERVED_NAME
from tests.integration.streams.test_disconnect import LONG, OpenStream, wait_idle

ALIASES = {  # name as exposed -> Prometheus type
    "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge", "vllm:gpu_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter", "vllm:prefix_cache_hits": "counter",
    "vllm:gpu_prefix_cache_hit_rate": "gauge", "vllm:cache_config_info": "gauge",
}


def scrape(server) -> dict[str, tuple[str, list]]:
    """family name -> (type, samples), from one /metrics response."""
    text = httpx2.get(f"{server.url}/metrics", timeout=5).text
    return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(text)}


def value(families, family: str, sample: str | None = None) -> float:
    samples = [s for s in families[family][1] if sample is None or s.name == sample]
    assert len(samples) == 1, (family, samples)
    return samples[0].value


def check_aliases(families, total_blocks: int = 512) -> None:
    """One scrape's aliases against MILI's own series in that same scrape (which sum over the workers)."""
    for name, kind in ALIASES.items():
        assert name in families, f"{name} missing from /metrics"
        assert families[name][0] == kind, (name, families[name][0])
        for sample in families[name][1]:
            assert sample.labels.get("model_name") == SERVED_NAME, (name, sample)
    assert value(families, "vllm:num_requests_running") == value(families, "mili_requests_running")
    assert value(families, "vllm:num_requests_waiting") == value(families, "mili_requests_waiting")
    used, total = value(families, "mili_kv_blocks_used"), value(families, "mili_kv_blocks_total")
    assert total == total_blocks  # --num-kv-blocks times --workers
    kv = value(families, "vllm:kv_cache_usage_perc")
    assert 0.0 <= kv <= 1.0 and abs(kv - used / total) < 1e-9
    assert value(families, "vllm:gpu_cache_usage_perc") == kv
    queries = value(families, "vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total")
    hits = value(families, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total")
    assert queries == value(families, "mili_prefix_cache_queries", "mili_prefix_cache_queries_total")
    assert hits == value(families, "mili_prefix_cache_hits", "mili_prefix_cache_hits_total")
    rate = value(families, "vllm:gpu_prefix_cache_hit_rate")
    assert abs(rate - (hits / queries if queries else 0.0)) < 1e-9
    (info,) = families["vllm:cache_config_info"][1]
    assert info.value == 1 and info.labels["block_size"] == "16" and info.labels["num_gpu_blocks"] == str(total_blocks)


def under_load(server, running: int, total_blocks: int, while_loaded) -> None:
    """The aliases idle; then with `running` long streams filling the sequence slots and 2 more requests
    queued (while_loaded(families) adds a test's own checks on that scrape); then idle again."""
    wait_idle(server)
    check_aliases(scrape(server), total_blocks)

    async def run():
        async with httpx2.AsyncClient(base_url=server.url, timeout=60) as client:
            streams = [await OpenStream(client, LONG).start() for _ in range(running)]
            queued = [asyncio.create_task(client.post("/v1/completions", json=LONG)) for _ in range(2)]
            try:
                deadline = time.monotonic() + 10
                while True:
                    families = scrape(server)
                    if value(families, "vllm:num_requests_waiting") == 2:
                        break
                    assert time.monotonic() < deadline, "the two extra requests never showed as waiting"
                    await asyncio.sleep(0.05)
                check_aliases(families, total_blocks)
                assert value(families, "vllm:num_requests_running") == running
                assert value(families, "vllm:kv_cache_usage_perc") > 0
                while_loaded(families)
            finally:
                for task in queued:
                    task.cancel()
                await asyncio.gather(*queued, return_exceptions=True)
                for stream in streams:
                    await stream.close()

    asyncio.run(run())
    wait_idle(server)
    families = scrape(server)
    check_aliases(families, total_blocks)
    assert value(families, "vllm:kv_cache_usage_perc") == 0


def test_aliases_follow_mili_series_under_load(server):
    under_load(server, running=16, total_blocks=512, while_loaded=lambda families: None)  # 16 slots


@pytest.fixture(scope="module")
def two_workers(tiny_model_dir, tmp_path_factory):
    """Two workers of 4 sequence slots and 160 KV blocks each."""
    srv = Server(tiny_model_dir, "--served-model-name", SERVED_NAME, "--workers", "2", "--num-kv-blocks", "160",
                 "--max-num-seqs", "4", "--max-num-batched-tokens", "256",
                 log_path=tmp_path_factory.mktemp("two-workers") / "server.log").start()
    try:
        deadline = time.monotonic() + 120  # /health is 200 once the first worker is ready
        while srv.wait_healthy()["workers_ready"] < 2:
            assert time.monotonic() < deadline, "the second worker never became ready"
            time.sleep(0.1)
        yield srv
    finally:
        srv.stop()


def worker_ledgers(server) -> list[dict]:
    """Each worker's own KV ledger (GET /debug/kv), the per-worker view the aliases must add up."""
    return httpx2.get(f"{server.url}/debug/kv", timeout=10).json()["workers"]


def test_aliases_sum_over_two_workers(two_workers):
    """Idle and with both workers busy, every alias equals MILI's own series, and those are the workers' sums:
    8 running requests where one worker holds at most 4, the blocks of both workers."""
    server = two_workers
    wait_idle(server)
    ledgers = worker_ledgers(server)
    assert len(ledgers) == 2 and [w["totals"]["blocks"] for w in ledgers] == [160, 160]

    def both_workers_busy(families):
        ledgers = worker_ledgers(server)
        running = [sum(1 for seqs in w["requests"].values() for s in seqs if s["status"] == "running")
                   for w in ledgers]
        assert running == [4, 4], running  # both workers busy, each at its 4 slots
        assert value(families, "vllm:num_requests_running") == sum(running)
        # Both workers hold blocks, and the usage alias is over both workers' 320 (check_aliases).
        assert all(w["totals"]["used"] > 0 for w in ledgers)

    under_load(server, running=8, total_blocks=320, while_loaded=both_workers_busy)


def test_prefix_hit_rate_alias_counts_a_repeated_prompt(server):
    body = {"model": SERVED_NAME, "prompt": [11] * 160, "max_tokens": 1}
    before = scrape(server)
    for _ in range(2):
        assert httpx2.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code == 200
    after = scrape(server)
    check_aliases(after)
    hits = lambda f: value(f, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total")  # noqa: E731
    assert hits(after) - hits(before) >= 144  # the second request reuses at least 9 full 16-token blocks
    assert value(after, "vllm:gpu_prefix_cache_hit_rate") > 0


def test_scrape_cost(server):
    """Routers poll /metrics every 50 ms: print what one scrape costs over HTTP (not asserted)."""
    with httpx2.Client(base_url=server.url, timeout=5) as client:
        client.get("/metrics")
        n = 1000
        started = time.perf_counter()
        for _ in range(n):
            assert client.get("/metrics").status_code == 200
        mean_ms = (time.perf_counter() - started) / n * 1000
    print(f"\n/metrics over HTTP: {mean_ms:.2f} ms per scrape (mean of {n}, keep-alive)")


def test_request_id_is_echoed_and_logged(server):
    mine = "trace-4f2a9c-from-the-router"
    counted = {c: server.metric("mili_http_responses_total", status=c) for c in ("2xx", "4xx")}
    r = httpx2.post(f"{server.url}/v1/completions", headers={"X-Request-Id": mine}, timeout=60,
                    json={"model": SERVED_NAME, "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200 and r.headers["x-request-id"] == mine
    # Streams and errors carry it too.
    with httpx2.stream("POST", f"{server.url}/v1/completions", headers={"X-Request-Id": mine + "-s"}, timeout=60,
                       json={"model": SERVED_NAME, "prompt": "hi", "max_tokens": 2, "stream": True}) as s:
        assert s.headers["x-request-id"] == mine + "-s"
        s.read()
    bad = httpx2.post(f"{server.url}/v1/completions", headers={"X-Request-Id": mine + "-e"}, timeout=60,
                      json={"model": SERVED_NAME, "prompt": "hi", "max_tokens": -1})
    assert bad.status_code == 400 and bad.headers["x-request-id"] == mine + "-e"
    # Without one (or with one that is not a short printable token), the server makes one.
    made = {httpx2.get(f"{server.url}/v1/models").headers["x-request-id"] for _ in range(2)}
    assert len(made) == 2 and all(len(m) == 32 for m in made)
    odd = httpx2.get(f"{server.url}/v1/models", headers={"X-Request-Id": "x" * 200}).headers["x-request-id"]
    assert odd != "x" * 200 and len(odd) == 32
    deadline = time.monotonic() + 5
    while True:  # the log line is written when the response ends
        log = server.log_path.read_text(errors="replace")
        lines = {tag: [ln for ln in log.splitlines() if f"request_id={mine}{tag} " in ln] for tag in ("", "-s", "-e")}
        if all(lines.values()):
            break
        assert time.monotonic() < deadline, f"request ids missing from the log: {lines}"
        time.sleep(0.1)
    assert "POST /v1/completions -> 200" in lines[""][0] and "-> 400" in lines["-e"][0]
    # Every /v1 response is counted by status class (the error-rate alert reads this).
    assert server.metric("mili_http_responses_total", status="2xx") >= counted["2xx"] + 5
    assert server.metric("mili_http_responses_total", status="4xx") >= counted["4xx"] + 1


def test_version_route(server):
    """GET /version: MILI's version (and, for SMG, the sign of a backend that speaks vLLM's metric protocol)."""
    r = httpx2.get(f"{server.url}/version", timeout=5)
    assert r.status_code == 200 and r.json()["server"] == "mili" and r.json()["version"]
