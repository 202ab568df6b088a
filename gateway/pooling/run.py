"""Pooling prompts through the workers: the same admission as generation (a ready worker, queue capacity, the
deadline, the API key's concurrency), each prompt one prefill-only request, their vectors gathered in order.

A client that leaves, a deadline that passes or one prompt that fails aborts the request's other prompts, so
their KV blocks are freed at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from starlette.requests import Request

from gateway.openai.routes import take_place
from gateway.server.auth import caller
from gateway.server.client_io import collect_unless_disconnected
from gateway.server.deadlines import DeadlineExceeded, exceeded
from gateway.server.errors import ApiError
from gateway.workers.link import RequestHandle, WorkerLost
from gateway.workers.pool import NoWorkerAvailable
from shared import wire
from shared.sampling_params import SamplingParams


async def pool_prompts(request: Request, prompts: list[list[int]], deadline: float | None,
                       priority: int | None = None) -> list[list[float]]:
    """Each prompt's pooled vector (an embedding, or [score]), in the prompts' order; `priority` as chat's (checked
    against the server's scheduling policy before).

    At most as many prompts are in the workers at once as they run sequences at once (the rest follow as those
    finish), so a request of 2048 inputs neither needs that much queue room nor crowds out the requests behind it."""
    state = request.app.state.mili
    key = caller(request)
    window = state.settings.num_workers * state.engine_config.max_num_seqs
    lease, arrival = take_place(state, prompts[:window], key, deadline)
    num_tokens = sum(map(len, prompts))
    handles: list[RequestHandle] = []
    room = asyncio.Semaphore(window)
    params = SamplingParams(max_tokens=0, priority=priority or 0)  # prefill only

    async def pooled(prompt: list[int]) -> list[float]:
        async with room:
            try:
                handle = state.pool.submit(prompt, params, deadline, key.name, key.weight)
            except NoWorkerAvailable as e:
                raise ApiError(503, f"no worker is ready: {e}", code="worker_unavailable") from None
            handles.append(handle)
            return await _result(handle, state.metrics)

    reason = "abort"
    try:
        results = await collect_unless_disconnected(request, _in_order([pooled(p) for p in prompts]))
        reason = "stop"
        state.metrics.e2e.labels(*state.metrics.labels).observe(time.monotonic() - arrival)
        return results
    except ApiError as e:
        reason = "deadline" if e.code == "deadline_exceeded" else reason
        raise
    finally:
        for handle in handles:
            state.pool.abort(handle)  # a no-op for those that finished
        lease.release()
        state.metrics.finished(reason, num_tokens)


async def _in_order(coroutines: list[Coroutine[Any, Any, list[float]]]) -> AsyncIterator[list[float]]:
    """The coroutines' results in order; they run at once, and the first failure ends them all."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failed = next((t for t in tasks if t.done() and t.exception() is not None), None)
        if failed is not None:
            raise failed.exception()
        for task in tasks:
            yield task.result()
    finally:
        for task in tasks:
            task.cancel()


async def _result(handle: RequestHandle, metrics) -> list[float]:
    while True:
        item = await handle.queue.get()
        if isinstance(item, WorkerLost):
            raise ApiError(503, item.message, code="worker_lost")
        if isinstance(item, wire.RequestFailed):
            raise ApiError(400, item.message, item.param)
        if isinstance(item, DeadlineExceeded) or item.finish_reason == "deadline":
            raise exceeded()
        if item.queue_time is not None:
            metrics.queue_time.labels(*metrics.labels).observe(item.queue_time)
        if item.pooled is not None:
            return item.pooled
        if item.finish_reason is not None:
            raise ApiError(503, f"the worker ended the request without a result ({item.finish_reason})",
                           code="worker_lost")
