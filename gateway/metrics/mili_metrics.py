"""Prometheus metrics under the names README.md's "Metrics" lists (dashboards, alerts and routers rely on them),
fed by gateway timings and workers' step stats.

Gauges are sums over the live workers. Workers report their prefix-cache and preemption counters as
running totals since they started; the gateway adds the difference to its counters, so a restarted
worker (whose totals begin again at zero) never makes a counter go backwards.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gateway.metrics.router_metrics import RouterContract
from gateway.metrics.spec_metrics import SpecDecodeMetrics
from gateway.server.auth import ROUTE_LABELS
from shared import wire

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model: str, block_size: int = 16, task: str = "generate"):
        disable_created_metrics()  # the *_created series only double the output
        self.registry = r = CollectorRegistry()
        labels = ["model"]
        self.model = model
        # The series every request feeds, generation and pooling alike (--task), carry the server's task too.
        by_task = ["model", "task"]
        self.labels = (model, task)
        self.requests_running = Gauge("mili_requests_running", "Sequences running in the workers", labels, registry=r)
        self.requests_waiting = Gauge("mili_requests_waiting", "Sequences waiting in the workers", labels, registry=r)
        self.kv_blocks_total = Gauge("mili_kv_blocks_total", "KV cache blocks in the workers", labels, registry=r)
        self.kv_blocks_used = Gauge("mili_kv_blocks_used", "KV cache blocks held by live requests", labels,
                                    registry=r)
        self.worker_up = Gauge("mili_worker_up", "Workers ready to serve", labels, registry=r)
        self.prompt_tokens = Counter("mili_prompt_tokens", "Prompt tokens of requests that ended", by_task, registry=r)
        self.generation_tokens = Counter("mili_generation_tokens", "Generated tokens", labels, registry=r)
        self.prefix_queries = Counter("mili_prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                      labels, registry=r)
        self.prefix_hits = Counter("mili_prefix_cache_hits", "Prompt tokens served from the prefix cache", labels,
                                   registry=r)
        self.preemptions = Counter("mili_preemptions", "Sequences preempted for recompute", labels, registry=r)
        self.kv_invariant_violations = Counter(
            "mili_kv_invariant_violations", "KV block accounting found broken by a worker's audit (and repaired)",
            labels, registry=r)
        self.requests = Counter("mili_requests", "Finished requests", by_task + ["finish_reason"], registry=r)
        self.http_responses = Counter("mili_http_responses", "Responses of the /v1 API by status class (2xx, 4xx, 5xx)",
                                      labels + ["status"], registry=r)
        for status in ("2xx", "4xx", "5xx"):
            self.http_responses.labels(model, status)
        # 401s on every route, scrapes and router polls included: a router or scraper configured without the key
        # (which would otherwise fail silently: its own polls are not API answers) shows up here.
        self.http_unauthorized = Counter("mili_http_unauthorized", "Requests refused for a missing or invalid API "
                                         "key, by route", labels + ["route"], registry=r)
        for route in ROUTE_LABELS:
            self.http_unauthorized.labels(model, route)
        self.ttft = Histogram("mili_time_to_first_token_seconds", "Time to first token", labels,
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("mili_inter_token_latency_seconds", "Time between streamed tokens", labels,
                             buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("mili_e2e_request_latency_seconds", "Request latency, arrival to last token", by_task,
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram("mili_request_queue_time_seconds", "Time a request waited in a worker's queue",
                                    by_task, buckets=_LATENCY_BUCKETS, registry=r)
        # A stream that falls behind its worker sends the steps that piled up as one event (gateway/workers/output_queue.py):
        # a rate above zero says the gateway, not the engine, is the limit.
        self.stream_merged_deltas = Counter(
            "mili_stream_merged_deltas", "Engine steps' token deltas merged into the one before them because their "
            "stream had fallen behind the engine", labels, registry=r)
        # Resumable streams (gateway/streams/resume_buffer.py).
        self.stream_resume_buffered_bytes = Gauge(
            "mili_stream_resume_buffered_bytes", "Bytes of stream events kept for resuming", labels, registry=r)
        self.stream_resumes = Counter("mili_stream_resumes", "Streams resumed (GET /v1/streams/{id})", labels,
                                      registry=r)
        self.stream_resume_aborted = Counter(
            "mili_stream_resume_aborted", "Disconnected streams aborted: not resumed within the TTL (ttl), or "
            "dropped for the buffer cap (buffer_full)", labels + ["reason"], registry=r)
        self.stream_resume_evicted = Counter(
            "mili_stream_resume_evicted", "Stream buffers given up before their TTL to stay under the buffer cap",
            labels, registry=r)
        for reason in ("ttl", "buffer_full"):
            self.stream_resume_aborted.labels(model, reason)
        # Stored Responses API responses (gateway/responses_api/store.py), set at each scrape.
        self.responses_stored = Gauge("mili_responses_stored", "Responses API responses kept for "
                                      "previous_response_id and GET /v1/responses/{id}", labels, registry=r)
        self.responses_stored_bytes = Gauge("mili_responses_stored_bytes", "Bytes of the stored Responses API "
                                            "responses, against --responses-store-buffer", labels, registry=r)
        # Every series exists from the start (at 0), so dashboards and rate() see it before the first event.
        for metric in (self.requests_running, self.requests_waiting, self.kv_blocks_total, self.kv_blocks_used,
                       self.worker_up, self.generation_tokens, self.prefix_queries,
                       self.prefix_hits, self.preemptions, self.ttft, self.itl,
                       self.kv_invariant_violations, self.stream_merged_deltas, self.stream_resume_buffered_bytes, self.stream_resumes,
                       self.stream_resume_evicted, self.responses_stored, self.responses_stored_bytes):
            metric.labels(model)
        for metric in (self.prompt_tokens, self.e2e, self.queue_time):
            metric.labels(*self.labels)
        # vLLM-named aliases of the series above, for the load-aware routers (gateway/metrics/router_metrics.py).
        self.router_contract = RouterContract(model, block_size)
        r.register(self.router_contract)
        self.spec_decode = SpecDecodeMetrics(model)  # speculative decoding (gateway/metrics/spec_metrics.py)
        r.register(self.spec_decode)

    def worker_stats(self, stats: list[wire.WorkerStats], num_ready: int) -> None:
        """Set the gauges from the latest stats of every live worker."""
        m = self.model
        running, waiting = sum(s.num_running for s in stats), sum(s.num_waiting for s in stats)
        used, total = sum(s.kv_blocks_used for s in stats), sum(s.kv_blocks_total for s in stats)
        self.requests_running.labels(m).set(running)
        self.requests_waiting.labels(m).set(waiting)
        self.kv_blocks_total.labels(m).set(total)
        self.kv_blocks_used.labels(m).set(used)
        self.worker_up.labels(m).set(num_ready)
        self.router_contract.set_load(running, waiting, used, total)

    def worker_counters(self, previous: wire.WorkerStats | None, stats: wire.WorkerStats) -> None:
        m = self.model
        for counter, name in ((self.prefix_queries, "prefix_cache_query_tokens"),
                              (self.prefix_hits, "prefix_cache_hit_tokens"), (self.preemptions, "num_preemptions"),
                              (self.kv_invariant_violations, "kv_invariant_violations")):
            delta = getattr(stats, name) - (getattr(previous, name) if previous else 0)
            if delta > 0:
                counter.labels(m).inc(delta)
        queries = stats.prefix_cache_query_tokens - (previous.prefix_cache_query_tokens if previous else 0)
        hits = stats.prefix_cache_hit_tokens - (previous.prefix_cache_hit_tokens if previous else 0)
        self.router_contract.add_prefix_cache(max(queries, 0), max(hits, 0))
        self.spec_decode.add(previous, stats)

    def finished(self, finish_reason: str, prompt_tokens: int) -> None:
        self.requests.labels(*self.labels, finish_reason).inc()
        self.prompt_tokens.labels(*self.labels).inc(prompt_tokens)

    def http_response(self, status: int) -> None:
        self.http_responses.labels(self.model, f"{status // 100}xx").inc()

    def unauthorized(self, route: str) -> None:
        self.http_unauthorized.labels(self.model, route).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def responses_store(self, count: int, size: int) -> None:
        self.responses_stored.labels(self.model).set(count)
        self.responses_stored_bytes.labels(self.model).set(size)
