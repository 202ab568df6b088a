"""The gateway's side of the worker link: spawns the worker processes, routes requests to them, fans
their token deltas out to per-request queues, and restarts a worker that dies.

Each worker slot owns a fresh pair of sockets per generation (gateway PUSH -> worker PULL for requests,
worker PUSH -> gateway PULL for outputs), bound by the gateway: a restarted worker never receives
messages queued for its predecessor. A supervisor task per slot awaits the process; its exit is noticed
at once and a new worker starts after a backoff. New requests go to live workers only (NoWorkerAvailable,
a 503, only when none is up). Of the dead worker's requests, those with no output yet are started afresh
on a live worker; the others, whose clients already have part of an answer, fail with `WorkerLost`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import msgspec
import zmq
import zmq.asyncio

from gateway.server.deadlines import DeadlineExceeded
from gateway.workers.output_queue import RequestOutputQueue
from shared import wire
from shared.config import EngineConfig
from shared.sampling_params import SamplingParams

log = logging.getLogger("mili.gateway")

BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0)
STABLE_S = 30.0  # a worker up this long resets the backoff
MAX_FRAMES_PER_READ = 64  # frames one wake-up of a reader takes, so it never holds the event loop for long


class NoWorkerAvailable(Exception):
    """No worker is ready to take a request; the message says why."""


@dataclass(frozen=True)
class WorkerLost:
    """Sent into a request's queue when its worker died."""

    message: str


@dataclass
class RequestHandle:
    request_id: str
    n: int
    worker: "WorkerSlot"
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


@dataclass(frozen=True)
class Transport:
    """Where the sockets live: ipc files in a private 0700 directory, or tcp on a given host."""

    ipc_dir: str | None = None
    tcp_host: str | None = None
    tcp_port: int = 0

    def addresses(self, slot: int, generation: int) -> tuple[str, str]:
        if self.tcp_host is not None:
            base = self.tcp_port + 2 * slot
            return f"tcp://{self.tcp_host}:{base}", f"tcp://{self.tcp_host}:{base + 1}"
        return (f"ipc://{self.ipc_dir}/w{slot}-g{generation}-requests",
                f"ipc://{self.ipc_dir}/w{slot}-g{generation}-outputs")


class WorkerSlot:
    """One worker process and its sockets, restarted in place when it dies."""

    def __init__(self, pool: "WorkerPool", index: int):
        self.pool = pool
        self.index = index
        self.generation = 0
        self.process: asyncio.subprocess.Process | None = None
        self.requests_sock: zmq.asyncio.Socket | None = None
        self.outputs_sock: zmq.asyncio.Socket | None = None
        self.ready: wire.WorkerReady | None = None
        self.stats: wire.WorkerStats | None = None
        self.requests: dict[str, RequestHandle] = {}
        self.down_reason = "starting"
        self._reader: asyncio.Task | None = None
        self.queries: dict[str, asyncio.Future] = {}  # DebugQuery token -> its DebugReply

    @property
    def is_ready(self) -> bool:
        return self.ready is not None

    async def supervise(self) -> None:
        failures = 0
        while not self.pool.stopping:
            started = time.monotonic()
            try:
                await self._spawn()
            except (zmq.ZMQError, OSError) as e:  # an address taken (zmq's error names it), no interpreter, ...
                await self._close_sockets()
                failures += 1
                delay = BACKOFF_S[min(failures, len(BACKOFF_S)) - 1]
                self.down_reason = f"cannot start worker {self.index}: {e}"
                log.error("%s; retrying in %.0f s", self.down_reason, delay)
                await asyncio.sleep(delay)
                continue
            code = await self.process.wait()
            if self.pool.stopping:
                break
            self._on_exit(code)
            failures = 1 if time.monotonic() - started > STABLE_S else failures + 1
            delay = BACKOFF_S[min(failures, len(BACKOFF_S)) - 1]
            log.error("worker %d exited with code %s; restarting in %.0f s", self.index, code, delay)
            await asyncio.sleep(delay)
        await self._close_sockets()

    async def _spawn(self) -> None:
        await self._close_sockets()
        self.generation += 1
        self.ready = None
        self.down_reason = "loading the model"
        requests_addr, outputs_addr = self.pool.transport.addresses(self.index, self.generation)
        ctx = self.pool.zmq_ctx
        self.requests_sock = ctx.socket(zmq.PUSH)
        self.requests_sock.setsockopt(zmq.LINGER, 0)
        # The gateway bounds its queue itself (--max-waiting-requests); a burst must never hit zmq's limit.
        self.requests_sock.setsockopt(zmq.SNDHWM, 0)
        self.requests_sock.bind(requests_addr)
        self.outputs_sock = ctx.socket(zmq.PULL)
        self.outputs_sock.setsockopt(zmq.LINGER, 0)
        self.outputs_sock.bind(outputs_addr)
        self._reader = asyncio.create_task(self._read_outputs(self.outputs_sock, self.generation))
        cmd = [sys.executable, "-m", "worker.process", "--requests", requests_addr, "--outputs", outputs_addr,
               "--config", json.dumps(asdict(self.pool.engine_config)),
               "--served-model-name", self.pool.served_model_name, "--threads", str(self.pool.threads_per_worker),
               "--name", f"worker-{self.index}", *(["--enable-debug-faults"] if self.pool.debug_faults else [])]
        self.process = await asyncio.create_subprocess_exec(*cmd, env=self.pool.worker_env)
        log.info("started worker %d (pid %d)", self.index, self.process.pid)

    def _on_exit(self, code: int | None) -> None:
        self.ready = None
        self.stats = None
        self.down_reason = f"worker {self.index} exited with code {code}; restarting"
        orphans = list(self.requests.values())
        self.requests.clear()
        for future in self.queries.values():
            if not future.done():
                future.set_result(None)
        self.queries.clear()
        lost = WorkerLost(f"the worker serving this request exited (code {code})")
        moved = 0
        for handle in orphans:
            # A request that has no output yet (queued in the dead worker, or sent after it died but before
            # its exit was noticed) is started afresh on a live worker; its client sees no difference.
            if not handle.has_output and self.pool.resubmit(handle):
                moved += 1
            else:
                handle.queue.put_nowait(lost)
        if orphans:
            log.warning("worker %d died with %d requests: %d moved to live workers, %d failed", self.index,
                        len(orphans), moved, len(orphans) - moved)

    async def _close_sockets(self) -> None:
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
            log.info("worker %d ready: %s on %s, %s, attention %s, quantization %s, max_model_len %d", self.index,
                     message.architecture, message.device, message.dtype, message.attention_backend,
                     message.quantization,
                     message.max_model_len)

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
        self.pool.on_stats(self, previous, stats)

    def send(self, message: wire.Message) -> None:
        # Without a high-water mark, PUSH queues instead of blocking; the event loop never waits here.
        sent = self.requests_sock.send(wire.encode(message), flags=zmq.NOBLOCK)
        sent.add_done_callback(self._check_sent)

    def _check_sent(self, sent: asyncio.Future) -> None:
        # With no worker connected (it just died) zmq refuses the frame at once. Nothing is lost that
        # matters: its requests are moved or failed when its exit is noticed, and aborts die with it.
        if not sent.cancelled() and sent.exception() is not None:
            log.warning("worker %d did not take a frame: %s", self.index, sent.exception())


class WorkerPool:
    def __init__(self, engine_config: EngineConfig, served_model_name: str, num_workers: int = 1,
                 threads_per_worker: int = 0, tcp_host: str | None = None, tcp_port: int = 0,
                 on_stats: Callable[[WorkerSlot, wire.WorkerStats | None, wire.WorkerStats], None] | None = None,
                 debug_faults: bool = False):
        self.engine_config = engine_config
        self.served_model_name = served_model_name
        self.threads_per_worker = threads_per_worker
        self._ipc_dir = None if tcp_host else tempfile.mkdtemp(prefix="mili-")  # mkdtemp makes it 0700
        self.transport = Transport(ipc_dir=self._ipc_dir, tcp_host=tcp_host, tcp_port=tcp_port)
        self.zmq_ctx = zmq.asyncio.Context()
        self.slots = [WorkerSlot(self, i) for i in range(num_workers)]
        self.stopping = False
        self._on_stats = on_stats
        self.debug_faults = debug_faults
        self._tasks: list[asyncio.Task] = []
        self._next_id = 0
        # The worker runs from this checkout whatever the current directory; PYTHONPATH carries it.
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.worker_env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (root, os.environ.get("PYTHONPATH")) if p))

    def start(self) -> None:
        self._tasks = [asyncio.create_task(slot.supervise()) for slot in self.slots]

    async def stop(self, timeout: float = 5.0) -> None:
        self.stopping = True
        procs = [s.process for s in self.slots if s.process is not None and s.process.returncode is None]
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for slot in self.slots:
            await slot._close_sockets()
        self.zmq_ctx.term()
        if self._ipc_dir:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)

    # ----- state -----
    @property
    def ready_slots(self) -> list[WorkerSlot]:
        return [s for s in self.slots if s.is_ready]

    @property
    def info(self) -> wire.WorkerReady | None:
        """What the first ready worker announced (all workers serve the same model and settings)."""
        ready = self.ready_slots
        return ready[0].ready if ready else None

    def down_reasons(self) -> list[str]:
        return [s.down_reason for s in self.slots if not s.is_ready]

    def num_in_flight(self) -> int:
        return sum(len(s.requests) for s in self.slots)

    def on_stats(self, slot: WorkerSlot, previous: wire.WorkerStats | None, stats: wire.WorkerStats) -> None:
        if self._on_stats is not None:
            self._on_stats(slot, previous, stats)

    # ----- requests -----
    def submit(self, prompt_token_ids: list[int], params: SamplingParams, deadline: float | None = None,
               tenant: str = "", tenant_weight: float = 1.0) -> RequestHandle:
        """Send a request to the live worker with the fewest requests in flight (a dead worker is never
        chosen: its slot is not ready from the moment its exit is noticed). `deadline` (time.monotonic())
        travels as the seconds left; a timer also ends the request here when it passes. `tenant` (an API
        key's name) and its weight travel with it: each worker admits weighted-fair between tenants."""
        slot = self._pick()
        if slot is None:
            raise NoWorkerAvailable("; ".join(self.down_reasons()) or "no worker is running")
        add = wire.AddRequest(request_id="", prompt_token_ids=prompt_token_ids,
                              params=wire.sampling_params_to_wire(params), tenant=tenant,
                              tenant_weight=tenant_weight)
        handle = RequestHandle("", params.n, slot, add, deadline=deadline)
        if deadline is not None:
            handle.deadline_timer = asyncio.get_running_loop().call_later(
                max(0.0, deadline - time.monotonic()), handle.queue.put_nowait, DeadlineExceeded())
        self._send_to(slot, handle)
        return handle

    def resubmit(self, handle: RequestHandle) -> bool:
        """Start a request that has no output yet afresh on a live worker; False when none is up."""
        slot = self._pick()
        if slot is None:
            return False
        self._send_to(slot, handle)
        return True

    def _pick(self) -> WorkerSlot | None:
        slots = self.ready_slots
        return min(slots, key=lambda s: len(s.requests)) if slots else None  # fewest requests in flight

    def _send_to(self, slot: WorkerSlot, handle: RequestHandle) -> None:
        self._next_id += 1
        handle.request_id = f"{slot.index}-{slot.generation}-{self._next_id}"
        handle.worker = slot
        # The seconds left are counted again for each send: a resubmitted request keeps its deadline.
        timeout_s = None if handle.deadline is None else max(0.0, handle.deadline - time.monotonic())
        handle.add = msgspec.structs.replace(handle.add, request_id=handle.request_id, timeout_s=timeout_s)
        slot.requests[handle.request_id] = handle
        slot.send(handle.add)

    def abort(self, handle: RequestHandle) -> None:
        """Stop a request wherever it is; a no-op once it finished or its worker died."""
        if handle.deadline_timer is not None:
            handle.deadline_timer.cancel()
        slot = handle.worker
        if slot.requests.pop(handle.request_id, None) is not None and slot.is_ready:
            slot.send(wire.AbortRequests(request_ids=[handle.request_id]))

    def abort_choice(self, handle: RequestHandle, index: int) -> None:
        """Stop one choice of a request whose other choices run on; its end comes back as a delta."""
        slot = handle.worker
        if handle.request_id in slot.requests and slot.is_ready:
            slot.send(wire.AbortChoices(request_id=handle.request_id, indices=[index]))

    # ----- operator queries -----
    async def query(self, what: str, arg: str | None = None,
                    timeout: float = 10.0) -> list[tuple[int, wire.DebugReply | None]]:
        """Ask every ready worker; (worker index, its reply or None when it died or did not answer in time)."""
        asked = []
        for slot in self.ready_slots:
            token = secrets.token_hex(8)
            future = asyncio.get_running_loop().create_future()
            slot.queries[token] = future
            slot.send(wire.DebugQuery(token=token, what=what, arg=arg))
            asked.append((slot, token, future))
        results = []
        for slot, token, future in asked:
            try:
                # A worker answers between two steps; a long prefill step may hold it a while.
                results.append((slot.index, await asyncio.wait_for(future, timeout)))
            except asyncio.TimeoutError:
                slot.queries.pop(token, None)
                results.append((slot.index, None))
        return results
