"""The gateway's side of the worker link: spawns the worker processes, routes requests to them, fans
their token deltas out to per-request queues, and restarts a worker that dies.

Each worker slot owns a fresh pair of sockets per generation (gateway PUSH -> worker PULL for requests,
worker PUSH -> gateway PULL for outputs), bound by the gateway: a restarted worker never receives
messages queued for its predecessor. A supervisor task per slot awaits the process; its exit is noticed
at once, every request on it fails with `WorkerLost`, and a new worker starts after a backoff.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import zmq
import zmq.asyncio

from shared import wire
from shared.config import EngineConfig
from shared.sampling_params import SamplingParams

log = logging.getLogger("mili.gateway")

BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0)
STABLE_S = 30.0  # a worker up this long resets the backoff


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
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)  # TokenDelta | RequestFailed | WorkerLost
    finished: set[int] = field(default_factory=set)

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

    @property
    def is_ready(self) -> bool:
        return self.ready is not None

    async def supervise(self) -> None:
        failures = 0
        while not self.pool.stopping:
            started = time.monotonic()
            await self._spawn()
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
               "--name", f"worker-{self.index}"]
        self.process = await asyncio.create_subprocess_exec(*cmd, env=self.pool.worker_env)
        log.info("started worker %d (pid %d)", self.index, self.process.pid)

    def _on_exit(self, code: int | None) -> None:
        self.ready = None
        self.stats = None
        self.down_reason = f"worker {self.index} exited with code {code}; restarting"
        lost = WorkerLost(f"the worker serving this request exited (code {code})")
        for handle in self.requests.values():
            handle.queue.put_nowait(lost)
        self.requests.clear()

    async def _close_sockets(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        for sock in (self.requests_sock, self.outputs_sock):
            if sock is not None:
                sock.close(linger=0)
        self.requests_sock = self.outputs_sock = None

    async def _read_outputs(self, sock: zmq.asyncio.Socket, generation: int) -> None:
        allowed = (wire.WorkerReady, wire.StepOutputs, wire.Heartbeat, wire.RequestFailed)
        while True:
            frame = await sock.recv(copy=True)
            try:
                message = wire.decode(frame, allowed)
            except wire.WireError as e:
                log.warning("rejected a frame from worker %d: %s", self.index, e)
                continue
            if generation == self.generation:
                self._dispatch(message)

    def _dispatch(self, message: wire.Message) -> None:
        if isinstance(message, wire.StepOutputs):
            for delta in message.deltas:
                handle = self.requests.get(delta.request_id)
                if handle is None:
                    continue  # aborted by the gateway; the worker's last words about it
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
        elif isinstance(message, wire.WorkerReady):
            self.ready = message
            self.down_reason = ""
            self._set_stats(message.stats)
            log.info("worker %d ready: %s, %s, attention %s, max_model_len %d", self.index, message.architecture,
                     message.dtype, message.attention_backend, message.max_model_len)

    def _set_stats(self, stats: wire.WorkerStats) -> None:
        previous, self.stats = self.stats, stats
        self.pool.on_stats(self, previous, stats)

    def send(self, message: wire.Message) -> None:
        # Without a high-water mark, PUSH queues instead of blocking; the event loop never waits here.
        self.requests_sock.send(wire.encode(message), flags=zmq.NOBLOCK)


class WorkerPool:
    def __init__(self, engine_config: EngineConfig, served_model_name: str, num_workers: int = 1,
                 threads_per_worker: int = 0, tcp_host: str | None = None, tcp_port: int = 0,
                 on_stats: Callable[[WorkerSlot, wire.WorkerStats | None, wire.WorkerStats], None] | None = None):
        self.engine_config = engine_config
        self.served_model_name = served_model_name
        self.threads_per_worker = threads_per_worker
        self._ipc_dir = None if tcp_host else tempfile.mkdtemp(prefix="mili-")  # mkdtemp makes it 0700
        self.transport = Transport(ipc_dir=self._ipc_dir, tcp_host=tcp_host, tcp_port=tcp_port)
        self.zmq_ctx = zmq.asyncio.Context()
        self.slots = [WorkerSlot(self, i) for i in range(num_workers)]
        self.stopping = False
        self._on_stats = on_stats
        self._tasks: list[asyncio.Task] = []
        self._next_id = 0
        # The worker runs from this checkout whatever the current directory; PYTHONPATH carries it.
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    def submit(self, prompt_token_ids: list[int], params: SamplingParams) -> RequestHandle:
        slots = self.ready_slots
        if not slots:
            raise NoWorkerAvailable("; ".join(self.down_reasons()) or "no worker is running")
        slot = min(slots, key=lambda s: len(s.requests))  # fewest requests in flight
        self._next_id += 1
        request_id = f"{slot.index}-{slot.generation}-{self._next_id}"
        handle = RequestHandle(request_id, params.n, slot)
        slot.requests[request_id] = handle
        slot.send(wire.AddRequest(request_id=request_id, prompt_token_ids=prompt_token_ids,
                                  params=wire.sampling_params_to_wire(params)))
        return handle

    def abort(self, handle: RequestHandle) -> None:
        """Stop a request wherever it is; a no-op once it finished or its worker died."""
        slot = handle.worker
        if slot.requests.pop(handle.request_id, None) is not None and slot.is_ready:
            slot.send(wire.AbortRequests(request_ids=[handle.request_id]))

    def abort_choice(self, handle: RequestHandle, index: int) -> None:
        """Stop one choice of a request whose other choices run on; its end comes back as a delta."""
        slot = handle.worker
        if handle.request_id in slot.requests and slot.is_ready:
            slot.send(wire.AbortChoices(request_id=handle.request_id, indices=[index]))
