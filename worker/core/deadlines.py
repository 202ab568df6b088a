"""Request deadlines in the worker: which requests' time ran out, cheaply, every step.

A min-heap of (deadline, request id) on this process's monotonic clock; `expired` pops what is due.
Entries of requests that finished earlier stay until their time comes and are then ignored by the
engine, which checks the request still exists with that same deadline.
"""

from __future__ import annotations

import heapq


class DeadlineQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []

    def add(self, request_id: str, deadline: float) -> None:
        heapq.heappush(self._heap, (deadline, request_id))

    def expired(self, now: float) -> list[tuple[str, float]]:
        """(request id, deadline) of every entry due at `now`, earliest first."""
        due = []
        while self._heap and self._heap[0][0] <= now:
            deadline, request_id = heapq.heappop(self._heap)
            due.append((request_id, deadline))
        return due

    def __len__(self) -> int:
        return len(self._heap)
