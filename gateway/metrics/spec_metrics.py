"""Speculative decoding's series: vLLM's names (its users' dashboards read them) and MILI's histogram of
accepted tokens per draft.

Workers report running totals (shared/wire.py:WorkerStats); like the other worker counters
(mili_metrics.py), the gateway adds each report's increase, so a restarted worker never makes a series
go backwards. Derived as in vLLM: acceptance rate = accepted / draft tokens; mean acceptance length =
1 + accepted / drafts; the rate at position i = per_pos{position=i} / drafts.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from shared import wire

PREFIX = "vllm:spec_decode_"


class SpecDecodeMetrics(Collector):
    def __init__(self, model: str):
        self.model = model
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.per_position: list[int] = []
        self.histogram: list[int] = []  # drafts by accepted tokens (index = accepted count)

    def add(self, previous: wire.WorkerStats | None, stats: wire.WorkerStats) -> None:
        for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            delta = getattr(stats, f"spec_{name}") - (getattr(previous, f"spec_{name}") if previous else 0)
            if delta > 0:
                setattr(self, name, getattr(self, name) + delta)
        _add_lists(self.per_position, previous.spec_accepted_per_position if previous else [],
                   stats.spec_accepted_per_position)
        _add_lists(self.histogram, previous.spec_acceptance_histogram if previous else [],
                   stats.spec_acceptance_histogram)

    def collect(self) -> Iterator[Metric]:
        labels = ["model_name"]
        for name, doc, value in (
                ("num_drafts", "Sequence steps that verified speculative drafts", self.num_drafts),
                ("num_draft_tokens", "Speculative draft tokens verified", self.num_draft_tokens),
                ("num_accepted_tokens", "Speculative draft tokens accepted", self.num_accepted_tokens)):
            family = CounterMetricFamily(PREFIX + name, doc, labels=labels)
            family.add_metric([self.model], value)
            yield family
        per_pos = CounterMetricFamily(PREFIX + "num_accepted_tokens_per_pos",
                                      "Speculative draft tokens accepted at each draft position",
                                      labels=labels + ["position"])
        for position, value in enumerate(self.per_position):
            per_pos.add_metric([self.model, str(position)], value)
        yield per_pos
        buckets, total = [], 0
        for accepted, count in enumerate(self.histogram):
            total += count
            buckets.append((str(float(accepted)), total))
        buckets.append(("+Inf", total))
        hist = HistogramMetricFamily("mili_spec_decode_accepted_tokens_per_draft",
                                     "Speculative draft tokens accepted per verification", labels=["model"])
        hist.add_metric([self.model], buckets, sum(a * c for a, c in enumerate(self.histogram)))
        yield hist


def _add_lists(totals: list[int], before: list[int], now: list[int]) -> None:
    """totals[i] += now[i] - before[i] (positive increases only), growing totals as needed."""
    if len(totals) < len(now):
        totals.extend([0] * (len(now) - len(totals)))
    for i, value in enumerate(now):
        delta = value - (before[i] if i < len(before) else 0)
        if delta > 0:
            totals[i] += delta
