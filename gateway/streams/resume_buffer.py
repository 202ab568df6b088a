"""Resumable streams (--stream-resume-ttl): a stream's events go into a buffer, written by a task of their own,
so a generation outlives the HTTP connection that asked for it and a client that lost the connection can
read the rest, from any event on, under the stream's id.

Life of a stream (times on the gateway's monotonic clock):
- running with a reader: the reader sends events as the producer appends them;
- running with no reader (its client went away): it keeps generating; if nobody resumes it within the TTL
  after the disconnect, it is aborted in its worker (its KV blocks are freed) and forgotten;
- finished: the buffer is kept for the TTL after the last event, then forgotten.

One reader at a time: a new reader (a resume) takes the stream over and the old one's response ends (it is
the same client on a new connection, or a client that should not have two).

Memory is bounded by one cap on the bytes buffered by all streams. When an event would pass it, the
buffers that nobody reads go first, the one idle longest first (a running one is aborted); when every
buffered stream has a reader, the stream that is growing stops being resumable: its id is forgotten, and
it keeps only the events its reader has not sent yet, as a stream does without this feature (a disconnect
then aborts it at once).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import NamedTuple, Union

from gateway.metrics.mili_metrics import Metrics
from gateway.server.errors import ApiError

log = logging.getLogger("mili.gateway")


class NamedEvent(NamedTuple):
    """A payload sent with an SSE event name (the Responses API's typed events); a plain str has none."""

    event: str
    data: str


Payload = Union[str, NamedEvent]


def payload_bytes(payload: Payload) -> int:
    if isinstance(payload, NamedEvent):
        return len(payload.event) + len(payload.data.encode())
    return len(payload.encode())


def owner_digest(authorization: str) -> bytes:
    """What a stream keeps of its client's Authorization header: only same-key resumes may match it."""
    return hashlib.sha256(authorization.encode("latin-1")).digest()


class ResumableStream:
    """One stream's events (SSE payloads, the id of each is its index) and who reads them."""

    def __init__(self, stream_id: str, owner: bytes, abort: Callable[[], None]):
        self.id = stream_id
        self.owner = owner
        self.abort_request = abort  # drops the request in its worker (idempotent)
        self.events: list[Payload] = []  # events[i - base] has id i
        self.base = 0  # ids below were released (only once the stream is no longer resumable)
        self.nbytes = 0  # what the events count against the cap while the stream is registered
        self.finished = False  # no event will follow (the last one was [DONE], or it was aborted)
        self.registered = True  # in the registry: it can be resumed
        self.aborted = False
        self.reader: Reader | None = None
        self.idle_since = time.monotonic()  # when it lost its reader or finished (eviction order)
        self.producer: asyncio.Task | None = None
        self.timer: asyncio.TimerHandle | None = None
        self._wakeup = asyncio.Event()

    @property
    def next_id(self) -> int:
        return self.base + len(self.events)

    @property
    def idle(self) -> bool:
        """Nobody would miss its buffer now: it has no reader, or has finished (a reader keeps its own reference)."""
        return self.reader is None or self.finished

    def notify(self) -> None:
        self._wakeup.set()
        self._wakeup = asyncio.Event()

    async def changed(self) -> None:
        await self._wakeup.wait()

    def release_before(self, event_id: int) -> None:
        if event_id > self.base:
            del self.events[:event_id - self.base]
            self.base = event_id


class Reader:
    """One response reading a stream from `cursor` on; `detach()` (idempotent) when the response ends."""

    def __init__(self, registry: StreamRegistry, stream: ResumableStream, cursor: int):
        self.registry = registry
        self.stream = stream
        self.cursor = cursor

    async def events(self) -> AsyncIterator[tuple[int, Payload]]:
        """(id, payload) from the cursor on, live, until the stream ends or another reader takes it over."""
        stream = self.stream
        try:
            while stream.reader is self:
                if self.cursor < stream.next_id:
                    event_id = self.cursor
                    payload = stream.events[event_id - stream.base]
                    self.cursor += 1
                    if not stream.registered:
                        stream.release_before(self.cursor)  # nobody can ask for it again
                    yield event_id, payload
                elif stream.finished:
                    return
                else:
                    await stream.changed()
        finally:
            self.detach()

    def detach(self) -> None:
        self.registry.detach(self)


class StreamRegistry:
    def __init__(self, ttl_s: float, max_bytes: int, metrics: Metrics):
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.streams: dict[str, ResumableStream] = {}
        self.buffered_bytes = 0

    # ----- streams -----
    def start(self, payloads: AsyncIterator[Payload], abort: Callable[[], None], authorization: str) -> Reader:
        """Run `payloads` into a new stream's buffer; the first reader (the response that started it)."""
        stream = ResumableStream(secrets.token_urlsafe(24), owner_digest(authorization), abort)
        self.streams[stream.id] = stream
        reader = self.attach(stream, 0)
        stream.producer = asyncio.create_task(self._produce(stream, payloads), name=f"stream {stream.id}")
        return reader

    def find(self, stream_id: str, authorization: str) -> ResumableStream | None:
        """The stream, if it is still here and was started with the same Authorization header."""
        stream = self.streams.get(stream_id)
        if stream is None or not hmac.compare_digest(stream.owner, owner_digest(authorization)):
            return None
        return stream

    def attach(self, stream: ResumableStream, cursor: int) -> Reader:
        """A new reader; a reader already there is ended (the new one takes over)."""
        reader = Reader(self, stream, cursor)
        stream.reader = reader
        if not stream.finished:
            self._cancel_timer(stream)
        stream.notify()  # a previous reader waiting for events sees it is no longer the reader
        return reader

    def detach(self, reader: Reader) -> None:
        stream = reader.stream
        if stream.reader is not reader:
            return  # taken over, or already detached
        stream.reader = None
        if stream.finished:
            return  # its drop timer already runs from when it finished
        stream.idle_since = time.monotonic()
        if stream.registered:
            self._cancel_timer(stream)
            stream.timer = asyncio.get_running_loop().call_later(self.ttl_s, self._expire, stream)
        else:
            self._abort(stream)  # no longer resumable: a disconnect ends it, as without resumable streams

    def close(self) -> None:
        """Server shutdown: every stream still running is aborted."""
        for stream in list(self.streams.values()):
            self._forget(stream)
            self._abort(stream)

    # ----- the producer -----
    async def _produce(self, stream: ResumableStream, payloads: AsyncIterator[Payload]) -> None:
        ended = False
        try:
            async for payload in payloads:
                self._append(stream, payload)
                if stream.aborted:  # evicted by its own event (see _make_room)
                    return
            ended = True
        except asyncio.CancelledError:
            raise  # aborted: readers see the stream end without [DONE]
        except Exception:
            log.exception("stream %s failed", stream.id)
            self._append(stream, json.dumps(ApiError(500, "internal server error").body()))
            self._append(stream, "[DONE]")
        finally:
            await _close(payloads)  # the request's own cleanup (abort in the worker) runs now
            if not ended:  # also covers payloads cancelled before they started (no cleanup of their own to run)
                stream.abort_request()
            stream.finished = True
            stream.idle_since = time.monotonic()
            self._cancel_timer(stream)
            if stream.registered:
                stream.timer = asyncio.get_running_loop().call_later(self.ttl_s, self._forget, stream)
            stream.notify()

    def _append(self, stream: ResumableStream, payload: Payload) -> None:
        if stream.registered:
            size = payload_bytes(payload)
            self._make_room(size, stream)
            if stream.aborted:
                return
            if stream.registered:
                stream.nbytes += size
                self._add_bytes(size)
        stream.events.append(payload)
        stream.notify()

    def _make_room(self, size: int, growing: ResumableStream) -> None:
        while self.buffered_bytes + size > self.max_bytes:
            idle = [s for s in self.streams.values() if s.idle]
            if idle:
                victim = min(idle, key=lambda s: s.idle_since)
                log.warning("stream buffers are full (%d bytes): dropping stream %s, idle for %.1f s",
                            self.buffered_bytes, victim.id, time.monotonic() - victim.idle_since)
                self._forget(victim)
                self.metrics.stream_resume_evicted.labels(self.metrics.model).inc()
                if not victim.finished:
                    self._abort(victim, "buffer_full")
            else:
                log.warning("stream buffers are full (%d bytes) and every stream has a reader: stream %s is no "
                            "longer resumable", self.buffered_bytes, growing.id)
                self._forget(growing)
                self.metrics.stream_resume_evicted.labels(self.metrics.model).inc()
                if growing.reader is not None:
                    growing.release_before(growing.reader.cursor)
                return

    # ----- ending -----
    def _expire(self, stream: ResumableStream) -> None:
        """The TTL passed with nobody reading a running stream."""
        stream.timer = None
        if stream.reader is None and not stream.finished:
            log.info("stream %s was not resumed within %.1f s: aborting it", stream.id, self.ttl_s)
            self._forget(stream)
            self._abort(stream, "ttl")

    def _forget(self, stream: ResumableStream) -> None:
        """Out of the registry (its id is now unknown), its bytes no longer counted."""
        self._cancel_timer(stream)
        if not stream.registered:
            return
        stream.registered = False
        del self.streams[stream.id]
        self._add_bytes(-stream.nbytes)
        stream.nbytes = 0

    def _abort(self, stream: ResumableStream, reason: str | None = None) -> None:
        if stream.finished or stream.aborted:
            return
        stream.aborted = True
        if reason is not None:
            self.metrics.stream_resume_aborted.labels(self.metrics.model, reason).inc()
        stream.abort_request()
        if stream.producer is not None and stream.producer is not asyncio.current_task():
            stream.producer.cancel()
        stream.finished = True
        stream.notify()

    def _cancel_timer(self, stream: ResumableStream) -> None:
        if stream.timer is not None:
            stream.timer.cancel()
            stream.timer = None

    def _add_bytes(self, delta: int) -> None:
        self.buffered_bytes += delta
        self.metrics.stream_resume_buffered_bytes.labels(self.metrics.model).set(self.buffered_bytes)


async def _close(payloads: AsyncIterator[Payload]) -> None:
    aclose = getattr(payloads, "aclose", None)
    if aclose is not None:
        await aclose()
