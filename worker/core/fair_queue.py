"""The scheduler's waiting queue, weighted-fair between tenants (API keys) and first-come-first-served
within each.

Each tenant has its own FCFS deque and a virtual service counter: the tokens the engine computed for it
(prefill chunks and decodes, charged as they are scheduled) divided by its weight. The next sequence to
admit is the head of the waiting tenant with the smallest counter; ties go to the head that arrived
first. This is the Virtual Token Counter of Sheng et al., "Fairness in Serving Large Language Models"
(OSDI 2024): a tenant that floods the queue runs up its counter with every token it is served, so
another tenant's requests get the next free slots, and over time each backlogged tenant is served
tokens in proportion to its weight.

A tenant cannot bank credit while it has no work: when it becomes active again its counter is lifted
to the smallest counter among the active tenants. When no tenant has work, the counters start over.

With one tenant there is one deque, and the order is exactly FCFS (preempted sequences back at the
head, as before).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

from worker.core.sequence import Sequence


class FairQueue:
    def __init__(self) -> None:
        self._queues: dict[str, deque[Sequence]] = {}  # only tenants with waiting sequences
        self._service: dict[str, float] = {}  # weighted tokens served, per tenant active in this busy period
        self._arrivals = 0

    # ----- the deque-like surface the scheduler and the engine use -----
    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def __bool__(self) -> bool:
        return bool(self._queues)

    def __iter__(self) -> Iterator[Sequence]:
        for q in self._queues.values():
            yield from q

    def __contains__(self, seq: object) -> bool:
        q = self._queues.get(getattr(seq, "tenant", None))
        return q is not None and seq in q

    def append(self, seq: Sequence, running: Iterable[Sequence] = ()) -> None:
        """A new sequence joins the back of its tenant's queue. `running`: the running sequences, which
        keep their tenants active (a tenant waiting for nothing but running is not idle)."""
        if seq.arrival_order is None:
            self._arrivals += 1
            seq.arrival_order = self._arrivals
        self._activate(seq.tenant, running)
        self._queues.setdefault(seq.tenant, deque()).append(seq)

    def appendleft(self, seq: Sequence) -> None:
        """Back to the head of its tenant's queue (preempted, or a choice released after its prompt's
        prefill): its tenant is active already, so the counters stay as they are."""
        if seq.arrival_order is None:
            self._arrivals += 1
            seq.arrival_order = self._arrivals
        self._service.setdefault(seq.tenant, 0.0)
        self._queues.setdefault(seq.tenant, deque()).appendleft(seq)

    def remove(self, seq: Sequence) -> None:
        q = self._queues[seq.tenant]
        q.remove(seq)
        if not q:
            del self._queues[seq.tenant]

    # ----- fairness -----
    def peek(self) -> Sequence:
        """The sequence to admit next: the head of the waiting tenant that was served least (weighted)."""
        return min((q[0] for q in self._queues.values()),
                   key=lambda s: (self._service.get(s.tenant, 0.0), s.arrival_order))

    def charge(self, seq: Sequence, num_tokens: int) -> None:
        """Count tokens computed for seq's tenant, divided by its weight."""
        self._service[seq.tenant] = self._service.get(seq.tenant, 0.0) + num_tokens / seq.tenant_weight

    def service(self, tenant: str) -> float | None:
        return self._service.get(tenant)

    def _activate(self, tenant: str, running: Iterable[Sequence]) -> None:
        active = set(self._queues) | {s.tenant for s in running}
        if tenant in active:
            return
        if not active:  # nothing runs or waits: everyone starts over at 0
            self._service.clear()
            self._service[tenant] = 0.0
            return
        floor = self._floor(active)
        self._service[tenant] = max(self._service.get(tenant, floor), floor)

    def _floor(self, active: Iterable[str]) -> float:
        counters = [self._service[t] for t in active if t in self._service]
        return min(counters) if counters else 0.0
