"""Per-key concurrency limits and per-key load metrics.

A key's limit (`max_concurrent` in the keys file) counts its requests in flight: admitted by the gateway
and not yet ended, queued in a worker or running. One HTTP request counts once, whatever its `n` or its
number of prompts (the scheduler's fair share already charges every token it computes). A request over
the limit is answered 429 with code `rate_limit_exceeded` and a `Retry-After` of

    ceil(D / L) seconds, at least 1 and at most 3600,

where L is the key's requests in flight and D the mean duration (arrival to end) of its last 16 finished
requests: by Little's law a key with L requests in flight that each take D seconds finishes one every
D / L seconds. Before any of its requests has finished, D is the age of its oldest request in flight.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.server.auth import ApiKey
from gateway.server.errors import ApiError

log = logging.getLogger("mili.gateway")

RECENT = 16  # finished requests whose durations make D
MAX_RETRY_AFTER_S = 3600


class _KeyLoad:
    def __init__(self) -> None:
        self.started: dict[int, float] = {}  # lease id -> arrival (time.monotonic())
        self.durations: deque[float] = deque(maxlen=RECENT)

    def retry_after(self, now: float) -> int:
        in_flight = len(self.started)
        if self.durations:
            mean = sum(self.durations) / len(self.durations)
        else:
            mean = now - min(self.started.values(), default=now)
        seconds = math.ceil(mean / in_flight) if in_flight else 1
        return min(max(seconds, 1), MAX_RETRY_AFTER_S)


class Lease:
    """One admitted request's place in its key's count; `release` (idempotent) gives it back."""

    def __init__(self, limits: "KeyLimits", key: ApiKey, lease_id: int, arrival: float):
        self._limits, self.key, self._id, self.arrival = limits, key, lease_id, arrival
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._limits._release(self)


class KeyLimits:
    def __init__(self, keys: Iterable[ApiKey], registry: CollectorRegistry, model: str):
        self.model = model
        self._loads: dict[str, _KeyLoad] = {}
        self._next_id = 0
        labels = ["model", "key"]
        self.in_flight = Gauge("mili_api_key_requests_in_flight",
                               "Requests of an API key admitted and not yet ended (queued or running)",
                               labels, registry=registry)
        self.admitted = Counter("mili_api_key_requests_admitted", "Requests admitted per API key", labels,
                                registry=registry)
        self.rejected = Counter("mili_api_key_requests_rejected",
                                "Requests refused with 429 because their API key was at its max_concurrent",
                                labels, registry=registry)
        # Labels come from the configured keys only (bounded); each series exists from the start.
        for key in keys:
            for metric in (self.in_flight, self.admitted, self.rejected):
                metric.labels(model, key.name)

    def _load(self, key: ApiKey) -> _KeyLoad:
        return self._loads.setdefault(key.name, _KeyLoad())

    def acquire(self, key: ApiKey, arrival: float | None = None) -> Lease:
        """Count a request against its key, or raise the 429 when the key is at its limit."""
        now = time.monotonic()
        load = self._load(key)
        if key.max_concurrent is not None and len(load.started) >= key.max_concurrent:
            self.rejected.labels(self.model, key.name).inc()
            retry = load.retry_after(now)
            log.info("API key %s is at its limit of %d requests in flight; retry after %d s", key.name,
                     key.max_concurrent, retry)
            raise ApiError(429, f"this API key may have at most {key.max_concurrent} requests in flight "
                                f"(queued or running); retry in {retry} s", code="rate_limit_exceeded",
                           headers={"Retry-After": str(retry)})
        self._next_id += 1
        lease = Lease(self, key, self._next_id, now if arrival is None else arrival)
        load.started[lease._id] = lease.arrival
        self.admitted.labels(self.model, key.name).inc()
        self.in_flight.labels(self.model, key.name).set(len(load.started))
        return lease

    def _release(self, lease: Lease) -> None:
        load = self._load(lease.key)
        load.started.pop(lease._id, None)
        load.durations.append(time.monotonic() - lease.arrival)
        self.in_flight.labels(self.model, lease.key.name).set(len(load.started))

    def num_in_flight(self, key: ApiKey) -> int:
        return len(self._load(key).started)
