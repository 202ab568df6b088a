"""One worker's link, as the gateway holds it: the two sockets of the worker process's current generation,
the frames read from them and dispatched to the requests that worker serves, and the frames sent to it.

The sockets are a fresh pair per generation (gateway PUSH -> worker PULL for requests, worker PUSH ->
gateway PULL for outputs), bound by the gateway: a restarted worker never receives messages queued for its
predecessor, and frames its predecessor sent are dropped. Every frame is decoded and checked
(shared/wire.py) before it is acted upon; one that validates but makes no sense is logged and dropped.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from gateway.workers.output_queue import RequestOutputQueue
from shared import wire

log = logging.getLogger("mili.gateway")

MAX_FRAMES_PER_READ = 64  # frames one wake-up of a reader takes, so it never holds the event loop for long


@dataclass(frozen=True)
class WorkerLost:
    """Sent into a request's queue when its worker died."""

    message: str


@dataclass
class RequestHandle:
    request_id: str
    n: int
    worker: "WorkerLink"
    add: wire.AddRequest  # kept to resubmit the request elsewhere while it has no output yet
    # TokenDelta | RequestFailed | WorkerLost | DeadlineExceeded; a choice's untaken deltas merge
    queue: RequestOutputQueue = field(default_factory=RequestOutputQueue)
    finished: set[int] = field(default_factory=set)
    deadline_timer: asyncio.TimerHandle | None = None  # puts DeadlineExceeded into the queue when due
    has_output: bool = False  # a delta reached the queue: from now on it lives and dies with its worker
    deadline: float | None = None  # time.monotonic() by which the request must end

    @property
    def done(self) -> bool:
        return len(self.finished) == self.n


@dataclass
class Transport:
    """Where the sockets live: ipc files in a private 0700 directory (made by `open`, removed by `close`, so an
    application built but never started leaves nothing behind), or tcp on a given host."""

    tcp_host: str | None = None
    tcp_port: int = 0
    ipc_dir: str | None = None

    def open(self) -> None:
        if self.tcp_host is None and self.ipc_dir is None:
            self.ipc_dir = tempfile.mkdtemp(prefix="mili-")  # mkdtemp makes it 0700

    def close(self) -> None:
        if self.ipc_dir is not None:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
            self.ipc_dir = None

    def addresses(self, slot: int, generation: int) -> tuple[str, str]:
        if self.tcp_host is not None:
            base = self.tcp_port + 2 * slot
            return f"tcp://{self.tcp_host}:{base}", f"tcp://{self.tcp_host}:{base + 1}"
        return (f"ipc://{self.ipc_dir}/w{slot}-g{generation}-requests",
                f"ipc://{self.ipc_dir}/w{slot}-g{generation}-outputs")


class WorkerLink:
    """One worker's sockets and the requests in flight on it; `open` binds a new generation's pair."""

    def __init__(self, index: int, on_stats: Callable[["WorkerLink", wire.WorkerStats | None, wire.WorkerStats], None]):
        self.index = index
        self.generation = 0
        self.requests_sock: zmq.asyncio.Socket | None = None
        self.outputs_sock: zmq.asyncio.Socket | None = None
        self.ready: wire.WorkerReady | None = None
        self.stats: wire.WorkerStats | None = None
        self.requests: dict[str, RequestHandle] = {}
        self.down_reason = "starting"
        self._reader: asyncio.Task | None = None
        self.queries: dict[str, asyncio.Future] = {}  # DebugQuery token -> its DebugReply
        self._on_stats = on_stats

    @property
    def is_ready(self) -> bool:
        return self.ready is not None

    def open(self, ctx: zmq.asyncio.Context, requests_addr: str, outputs_addr: str) -> None:
        """Binds the next generation's sockets and starts reading its outputs."""
        self.generation += 1
        self.ready = None
        self.requests_sock = ctx.socket(zmq.PUSH)
        self.requests_sock.setsockopt(zmq.LINGER, 0)
        # The gateway bounds its queue itself (--max-waiting-requests); a burst must never hit zmq's limit.
        self.requests_sock.setsockopt(zmq.SNDHWM, 0)
        self.requests_sock.bind(requests_addr)
        self.outputs_sock = ctx.socket(zmq.PULL)
        self.outputs_sock.setsockopt(zmq.LINGER, 0)
        self.outputs_sock.bind(outputs_addr)
        self._reader = asyncio.create_task(self._read_outputs(self.outputs_sock, self.generation))

    async def close_sockets(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        for sock in (self.requests_sock, self.outputs_sock):
            if sock is not None:
                sock.close(linger=0)
        self.requests_sock = self.outputs_sock = None

    async def _read_outputs(self, sock: zmq.asyncio.Socket, generation: int) -> None:
        allowed = (wire.WorkerReady, wire.StepOutputs, wire.Heartbeat, wire.RequestFailed, wire.DebugReply)
        while True:
            # Every frame already here, not one per wake-up: when the streams fall behind the engine, their
            # queues then merge the steps that piled up (gateway/workers/output_queue.py) rather than each stream
            # taking one step's delta per turn of the event loop while the worker's frames queue in ZeroMQ.
            frames = [await sock.recv(copy=True)]
            while len(frames) < MAX_FRAMES_PER_READ:
                try:
                    frames.append(await sock.recv(flags=zmq.NOBLOCK, copy=True))
                except zmq.Again:
                    break
            for frame in frames:
                self._take_frame(frame, allowed, generation)

    def _take_frame(self, frame: bytes, allowed: tuple[type, ...], generation: int) -> None:
        try:
            message = wire.decode(frame, allowed)
        except wire.WireError as e:
            log.warning("rejected a frame from worker %d: %s", self.index, e)
            return
        if generation != self.generation:
            return
        try:
            self._dispatch(message)
        except Exception:  # a frame that validates but makes no sense must not end this reader
            log.exception("dropped a frame from worker %d that could not be dispatched", self.index)

    def _dispatch(self, message: wire.Message) -> None:
        if isinstance(message, wire.StepOutputs):
            for delta in message.deltas:
                handle = self.requests.get(delta.request_id)
                if handle is None:
                    continue  # aborted by the gateway; the worker's last words about it
                if not self._delta_fits(delta, handle):
                    continue
                handle.has_output = True
                if delta.finish_reason is not None:
                    handle.finished.add(delta.index)
                    if handle.done:
                        del self.requests[delta.request_id]
                handle.queue.put_nowait(delta)
            self._set_stats(message.stats)
        elif isinstance(message, wire.Heartbeat):
            self._set_stats(message.stats)
        elif isinstance(message, wire.RequestFailed):
            handle = self.requests.pop(message.request_id, None)
            if handle is not None:
                handle.queue.put_nowait(message)
        elif isinstance(message, wire.DebugReply):
            future = self.queries.pop(message.token, None)
            if future is not None and not future.done():
                future.set_result(message)
        elif isinstance(message, wire.WorkerReady):
            if self.ready is not None:  # a worker announces itself once; the first word stands
                log.warning("rejected a frame from worker %d: a second WorkerReady", self.index)
                return
            self.ready = message
            self.down_reason = ""
            self._set_stats(message.stats)
            log.info("worker %d ready: %s on %s, %s, attention %s, quantization %s (activations %s), "
                     "max_model_len %d, speculative decoding %s", self.index, message.architecture, message.device,
                     message.dtype, message.attention_backend, message.quantization,
                     message.activation_quantization, message.max_model_len, message.speculative_decoding)

    def _delta_fits(self, delta: wire.TokenDelta, handle: RequestHandle) -> bool:
        """A delta names one of its request's choices and tokens of the model's vocabulary (a worker bug
        must fail loudly here, not as a crash in the request's text handling)."""
        vocab = self.ready.vocab_size if self.ready is not None else 0
        scored = [i for row in delta.prompt_logprobs or () for i in (row[0], *(t for t, _ in row[3]))]
        if delta.index < handle.n and all(t < vocab for t in (*delta.token_ids, *scored)):
            return True
        log.warning("rejected a delta from worker %d: choice %d of %d, tokens %s (vocabulary %d)", self.index,
                    delta.index, handle.n, delta.token_ids[:8], vocab)
        return False

    def _set_stats(self, stats: wire.WorkerStats) -> None:
        previous, self.stats = self.stats, stats
        self._on_stats(self, previous, stats)

    def send(self, message: wire.Message) -> None:
        # Without a high-water mark, PUSH queues instead of blocking; the event loop never waits here.
        sent = self.requests_sock.send(wire.encode(message), flags=zmq.NOBLOCK)
        sent.add_done_callback(self._check_sent)

    def _check_sent(self, sent: asyncio.Future) -> None:
        # With no worker connected (it just died) zmq refuses the frame at once. Nothing is lost that
        # matters: its requests are moved or failed when its exit is noticed, and aborts die with it.
        if not sent.cancelled() and sent.exception() is not None:
            log.warning("worker %d did not take a frame: %s", self.index, sent.exception())
