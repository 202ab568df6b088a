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

Under the priority policy (`by_priority`), priority comes first: the next sequence is taken from the lowest
priority value that has anything waiting, and fairness between tenants applies among the sequences of that
one priority (each tenant has a deque per priority; the service counters are the tenants' own, whatever
priority their tokens were served at). A tenant cannot jump the queue by sending everything at a high
priority relative to another tenant's equal priority, but any tenant's priority-0 request goes before every
priority-1 one, as vLLM's priority policy has it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

from worker.core.sequence import Sequence


class FairQueue:
    def __init__(self, by_priority: bool = False) -> None:
        self.by_priority = by_priority
        # (priority level, tenant) -> its FCFS deque; only those with waiting sequences. The level is 0 for
        # every sequence unless by_priority.
        self._queues: dict[tuple[int, str], deque[Sequence]] = {}
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
        q = self._queues.get(self._key(seq)) if isinstance(seq, Sequence) else None
        return q is not None and seq in q

    def append(self, seq: Sequence, running: Iterable[Sequence] = ()) -> None:
        """A new sequence joins the back of its tenant's queue. `running`: the running sequences, which
        keep their tenants active (a tenant waiting for nothing but running is not idle)."""
        if seq.arrival_order is None:
            self._arrivals += 1
            seq.arrival_order = self._arrivals
        self._activate(seq.tenant, running)
        self._queues.setdefault(self._key(seq), deque()).append(seq)

    def appendleft(self, seq: Sequence) -> None:
        """Back to the head of its tenant's queue (preempted, or a choice released after its prompt's
        prefill): its tenant is active already, so the counters stay as they are."""
        if seq.arrival_order is None:
            self._arrivals += 1
            seq.arrival_order = self._arrivals
        self._service.setdefault(seq.tenant, 0.0)
        self._queues.setdefault(self._key(seq), deque()).appendleft(seq)

    def remove(self, seq: Sequence) -> None:
        key = self._key(seq)
        q = self._queues[key]
        q.remove(seq)
        if not q:
            del self._queues[key]

    def _key(self, seq: Sequence) -> tuple[int, str]:
        return (seq.params.priority if self.by_priority else 0), seq.tenant

    # ----- fairness -----
    def peek(self) -> Sequence:
        """The sequence to admit next: among the heads of the lowest priority level waiting, the head of the
        tenant that was served least (weighted)."""
        return min((q[0] for q in self._queues.values()),
                   key=lambda s: (self._key(s)[0], self._service.get(s.tenant, 0.0), s.arrival_order))

    def charge(self, seq: Sequence, num_tokens: int) -> None:
        """Count tokens computed for seq's tenant, divided by its weight."""
        self._service[seq.tenant] = self._service.get(seq.tenant, 0.0) + num_tokens / seq.tenant_weight

    def service(self, tenant: str) -> float | None:
        return self._service.get(tenant)

    def _activate(self, tenant: str, running: Iterable[Sequence]) -> None:
        active = {t for _, t in self._queues} | {s.tenant for s in running}
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
