"""The gateway's pool of workers: starts one supervised worker per slot, routes each request to the live
worker with the fewest in flight, aborts requests and choices, and asks every worker operator questions.

New requests go to live workers only (NoWorkerAvailable, a 503, only when none is up); a request whose
worker died before it had output is started afresh on another (gateway/workers/supervisor.py).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Callable

import msgspec
import zmq.asyncio

from gateway.server.deadlines import DeadlineExceeded
from gateway.workers.link import RequestHandle, Transport, WorkerLink
from gateway.workers.supervisor import WorkerLaunch, WorkerSlot
from shared import wire
from shared.config import EngineConfig
from shared.sampling_params import SamplingParams


class NoWorkerAvailable(Exception):
    """No worker is ready to take a request; the message says why."""


class WorkerPool:
    def __init__(self, engine_config: EngineConfig, served_model_name: str, num_workers: int = 1,
                 threads_per_worker: int = 0, tcp_host: str | None = None, tcp_port: int = 0,
                 on_stats: Callable[[WorkerLink, wire.WorkerStats | None, wire.WorkerStats], None] | None = None,
                 debug_faults: bool = False, on_bad_config: Callable[[str], None] | None = None):
        """on_bad_config: called once a worker has exited because it cannot serve the model as configured."""
        self.engine_config = engine_config
        self.served_model_name = served_model_name
        self._transport = Transport(tcp_host=tcp_host, tcp_port=tcp_port)
        self.zmq_ctx = zmq.asyncio.Context()
        # The worker runs from this checkout whatever the current directory; PYTHONPATH carries it.
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
        launch = WorkerLaunch(engine_config, served_model_name, threads_per_worker, debug_faults, env,
                              self._transport, self.zmq_ctx)
        self.slots = [WorkerSlot(i, launch, self.on_stats, self.resubmit, lambda: self.stopping,
                                 on_bad_config or (lambda reason: None)) for i in range(num_workers)]
        self.stopping = False
        self._on_stats = on_stats
        self._tasks: list[asyncio.Task] = []
        self._next_id = 0

    def start(self) -> None:
        self._transport.open()
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
            await slot.close_sockets()
        self.zmq_ctx.term()
        self._transport.close()

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

    def on_stats(self, slot: WorkerLink, previous: wire.WorkerStats | None, stats: wire.WorkerStats) -> None:
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
