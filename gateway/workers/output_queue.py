"""One request's outputs on their way from its worker's reader to the task that streams them.

A choice's token deltas that wait here untaken merge into one (as vLLM v1's per-request output collector
does): when the gateway falls behind the engine (many streams at GPU speeds), each stream sends one event
for all the tokens that piled up instead of one event per engine step, so the gateway's work per token
falls as its load rises instead of its backlog growing. When it keeps up, nothing ever waits, and every
engine step is its own event.

Only token deltas merge, and only while no terminal item waits behind them: RequestFailed, WorkerLost,
DeadlineExceeded, or a delta ending its choice by the deadline (which the stream answers with an error, so
the tokens before it must not ride on it). What follows a terminal item is never read. A delta that ends
its choice otherwise is merged into, never merged on: the stream skips a finished choice's deltas.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import msgspec

from shared import wire


def merged(first: wire.TokenDelta, then: wire.TokenDelta) -> wire.TokenDelta:
    """One delta carrying `first`'s tokens, then `then`'s; the once-per-choice fields come from whichever
    has them, the running ones (cached tokens, finish) from the later."""
    logprobs = None
    if first.logprobs is not None or then.logprobs is not None:
        logprobs = [*(first.logprobs or ()), *(then.logprobs or ())]
    return msgspec.structs.replace(
        first, token_ids=[*first.token_ids, *then.token_ids], finish_reason=then.finish_reason,
        num_cached_tokens=then.num_cached_tokens, logprobs=logprobs, stop_token_id=then.stop_token_id,
        queue_time=first.queue_time if first.queue_time is not None else then.queue_time,
        prompt_logprobs=first.prompt_logprobs if first.prompt_logprobs is not None else then.prompt_logprobs,
        pooled=first.pooled if first.pooled is not None else then.pooled)


class RequestOutputQueue:
    """FIFO of TokenDelta | RequestFailed | WorkerLost | DeadlineExceeded with a choice's untaken deltas
    merged. `put_nowait` never blocks (the reader must not wait on one slow stream); `get` waits."""

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._open_delta: dict[int, int] = {}  # choice index -> position in _items of its mergeable delta
        self._taken = 0  # items taken since the queue began: positions above are absolute, less this
        self._waiter: asyncio.Future | None = None
        self.merges = 0  # deltas folded into an earlier one (observability; tests)

    def put_nowait(self, item: Any) -> None:
        if isinstance(item, wire.TokenDelta) and item.finish_reason != "deadline":
            position = self._open_delta.get(item.index)
            if position is not None:
                slot = position - self._taken
                self._items[slot] = merged(self._items[slot], item)
                self.merges += 1
                if item.finish_reason is not None:
                    del self._open_delta[item.index]
                return
            if item.finish_reason is None:
                self._open_delta[item.index] = self._taken + len(self._items)
        else:
            self._open_delta.clear()  # nothing is read past a terminal item
        self._items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    def get_nowait(self) -> Any:
        if not self._items:
            raise asyncio.QueueEmpty
        item = self._items.popleft()
        if isinstance(item, wire.TokenDelta) and self._open_delta.get(item.index) == self._taken:
            del self._open_delta[item.index]
        self._taken += 1
        return item

    async def get(self) -> Any:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.get_nowait()
