"""One worker process, started, awaited and restarted in place when it dies.

A supervisor task per worker awaits the process, so its exit is noticed at once; a new process starts after
a backoff that grows with quick failures and resets once a worker stayed up. Of the dead worker's requests,
those with no output yet are handed back to be started afresh on a live worker; the others, whose clients
already have part of an answer, fail with `WorkerLost`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import zmq
import zmq.asyncio

from gateway.workers.link import RequestHandle, Transport, WorkerLink, WorkerLost
from shared import wire
from shared.config import EngineConfig

log = logging.getLogger("mili.gateway")

BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0)
STABLE_S = 30.0  # a worker up this long resets the backoff


@dataclass(frozen=True)
class WorkerLaunch:
    """What every worker process is started with."""

    engine_config: EngineConfig
    served_model_name: str
    threads_per_worker: int
    debug_faults: bool
    env: dict[str, str]  # the worker runs from this checkout whatever the current directory (PYTHONPATH)
    transport: Transport
    zmq_ctx: zmq.asyncio.Context

    def command(self, index: int, requests_addr: str, outputs_addr: str) -> list[str]:
        return [sys.executable, "-m", "worker.process", "--requests", requests_addr, "--outputs", outputs_addr,
                "--config", json.dumps(asdict(self.engine_config)),
                "--served-model-name", self.served_model_name, "--threads", str(self.threads_per_worker),
                "--name", f"worker-{index}", *(["--enable-debug-faults"] if self.debug_faults else [])]


class WorkerSlot(WorkerLink):
    """One worker process and its link, restarted in place when it dies. `resubmit` starts a request that
    has no output yet on a live worker (False when none is up); `stopping` says the pool is shutting down;
    `on_bad_config` hears that the worker cannot serve the model as configured, which no restart mends."""

    def __init__(self, index: int, launch: WorkerLaunch,
                 on_stats: Callable[[WorkerLink, wire.WorkerStats | None, wire.WorkerStats], None],
                 resubmit: Callable[[RequestHandle], bool], stopping: Callable[[], bool],
                 on_bad_config: Callable[[str], None]):
        super().__init__(index, on_stats)
        self.launch = launch
        self.process: asyncio.subprocess.Process | None = None
        self._resubmit = resubmit
        self._stopping = stopping
        self._on_bad_config = on_bad_config

    async def supervise(self) -> None:
        failures = 0
        while not self._stopping():
            started = time.monotonic()
            try:
                await self._spawn()
            except (zmq.ZMQError, OSError) as e:  # an address taken (zmq's error names it), no interpreter, ...
                await self.close_sockets()
                failures += 1
                delay = BACKOFF_S[min(failures, len(BACKOFF_S)) - 1]
                self.down_reason = f"cannot start worker {self.index}: {e}"
                log.error("%s; retrying in %.0f s", self.down_reason, delay)
                await asyncio.sleep(delay)
                continue
            code = await self.process.wait()
            if self._stopping():
                break
            if code == wire.EXIT_BAD_CONFIG:
                self._on_exit(code)
                self.down_reason = f"worker {self.index} cannot serve the model as configured (its log says why)"
                self._on_bad_config(self.down_reason)
                break
            self._on_exit(code)
            failures = 1 if time.monotonic() - started > STABLE_S else failures + 1
            delay = BACKOFF_S[min(failures, len(BACKOFF_S)) - 1]
            log.error("worker %d exited with code %s; restarting in %.0f s", self.index, code, delay)
            await asyncio.sleep(delay)
        await self.close_sockets()

    async def _spawn(self) -> None:
        await self.close_sockets()
        self.down_reason = "loading the model"
        requests_addr, outputs_addr = self.launch.transport.addresses(self.index, self.generation + 1)
        self.open(self.launch.zmq_ctx, requests_addr, outputs_addr)
        cmd = self.launch.command(self.index, requests_addr, outputs_addr)
        self.process = await asyncio.create_subprocess_exec(*cmd, env=self.launch.env)
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
            if not handle.has_output and self._resubmit(handle):
                moved += 1
            else:
                handle.queue.put_nowait(lost)
        if orphans:
            log.warning("worker %d died with %d requests: %d moved to live workers, %d failed", self.index,
                        len(orphans), moved, len(orphans) - moved)
