"""The router contract: MILI's load under vLLM's metric names, for the routers that read them.

The Gateway API Inference Extension / llm-d endpoint picker and SMG (the SGLang-lineage router) pick a
backend from a handful of gauges under vLLM's names, the de facto model-server protocol. MILI serves
them as compatibility aliases of its own series (same values, summed over the live workers), labelled
`model_name` as vLLM labels them:

    vllm:num_requests_running     = mili_requests_running
    vllm:num_requests_waiting     = mili_requests_waiting
    vllm:kv_cache_usage_perc      = mili_kv_blocks_used / mili_kv_blocks_total (0-1; the EPP reads this)
    vllm:gpu_cache_usage_perc     = the same ratio under vLLM's older name (SMG reads this one)
    vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total
                                  = mili_prefix_cache_queries_total, mili_prefix_cache_hits_total (tokens)
    vllm:gpu_prefix_cache_hit_rate = hits / queries since the gateway started (SMG reads this one)
    vllm:cache_config_info{block_size, num_gpu_blocks} = 1 (the EPP's prefix-cache autotune reads the labels)

The values are computed at scrape time from a few numbers the gateway already keeps, so a scrape costs
the same whatever the traffic: the endpoint picker polls /metrics every 50 ms.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LABEL = "model_name"


class RouterContract(Collector):
    def __init__(self, model: str, block_size: int):
        self.model = model
        self.block_size = block_size
        self.running = self.waiting = self.blocks_used = self.blocks_total = 0
        self.prefix_queries = self.prefix_hits = 0

    def set_load(self, running: int, waiting: int, blocks_used: int, blocks_total: int) -> None:
        self.running, self.waiting = running, waiting
        self.blocks_used, self.blocks_total = blocks_used, blocks_total

    def add_prefix_cache(self, queries: int, hits: int) -> None:
        self.prefix_queries += queries
        self.prefix_hits += hits

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=[LABEL])
        g.add_metric([self.model], value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=[LABEL])
        c.add_metric([self.model], value)
        return c

    def collect(self) -> Iterator[Metric]:
        kv_usage = self.blocks_used / self.blocks_total if self.blocks_total else 0.0
        hit_rate = self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0
        yield self._gauge("vllm:num_requests_running", "Alias of mili_requests_running", self.running)
        yield self._gauge("vllm:num_requests_waiting", "Alias of mili_requests_waiting", self.waiting)
        yield self._gauge("vllm:kv_cache_usage_perc", "KV cache blocks in use, 0-1 (mili_kv_blocks_used / total)",
                          kv_usage)
        yield self._gauge("vllm:gpu_cache_usage_perc", "Older name of vllm:kv_cache_usage_perc", kv_usage)
        yield self._counter("vllm:prefix_cache_queries", "Alias of mili_prefix_cache_queries_total (tokens)",
                            self.prefix_queries)
        yield self._counter("vllm:prefix_cache_hits", "Alias of mili_prefix_cache_hits_total (tokens)",
                            self.prefix_hits)
        yield self._gauge("vllm:gpu_prefix_cache_hit_rate", "Prefix cache hits / queries (tokens) since start",
                          hit_rate)
        info = GaugeMetricFamily("vllm:cache_config_info", "KV cache configuration (labels; value 1)",
                                 labels=[LABEL, "block_size", "num_gpu_blocks"])
        info.add_metric([self.model, str(self.block_size), str(self.blocks_total)], 1)
        yield info
