"""The worker process: one engine behind two ZeroMQ sockets.

The main thread runs the engine loop (drain the inbox -> step -> emit). Two I/O threads own the
sockets (ZeroMQ sockets are not thread-safe): one receives and validates requests into the inbox, one
sends outputs from the outbox, so the sockets never wait on the model and the model never waits on a
socket. The gateway binds both sockets; this process connects, announces itself with WorkerReady and
exits when the gateway goes away.

Started by the gateway as `python -m worker.process --requests ADDR --outputs ADDR --config JSON`.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import queue
import signal
import sys
import threading
import time

import zmq

from shared import wire
from shared.config import EngineConfig
from shared.sampling_params import SamplingParamsError


def _die_with_the_gateway() -> None:
    """On Linux, have the kernel SIGKILL this process when its parent (the gateway) dies. Set before torch
    is imported: that import alone takes seconds on a busy machine, before any thread here can watch."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


_die_with_the_gateway()

from worker.engine import LLMEngine  # noqa: E402  (imports torch)
from worker.outputs import RequestRejected, SequenceOutput  # noqa: E402

log = logging.getLogger("mili.worker")

# While idle the worker still reports every HEARTBEAT_S, so the gateway's gauges stay fresh.
HEARTBEAT_S = 0.5
# After the gateway died: how long the engine loop gets to stop by itself before the process exits anyway.
_EXIT_GRACE_S = 2.0
_STOP = object()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.process")
    parser.add_argument("--requests", required=True, help="ZeroMQ address the gateway pushes requests on")
    parser.add_argument("--outputs", required=True, help="ZeroMQ address the gateway pulls outputs from")
    parser.add_argument("--config", required=True, help="EngineConfig fields as JSON")
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--name", default="worker")
    parser.add_argument("--enable-debug-faults", action="store_true",
                        help="accept DebugQuery messages that break the KV accounting on purpose (drills, tests)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s {args.name}: %(message)s")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    inbox: queue.Queue = queue.Queue()
    outbox: queue.Queue = queue.Queue()
    ctx = zmq.Context()
    threading.Thread(target=_receive, args=(ctx, args.requests, inbox, outbox, os.getppid()), daemon=True,
                     name="requests").start()
    sender = threading.Thread(target=_send, args=(ctx, args.outputs, outbox), daemon=True, name="outputs")
    sender.start()

    try:
        engine = LLMEngine(EngineConfig(**json.loads(args.config)))
    except ValueError as e:  # the model or a setting it cannot take: the same on every restart
        log.error("cannot serve %s: %s", args.served_model_name, e)
        return wire.EXIT_BAD_CONFIG
    if engine.runner.decode_graphs is not None:  # before the first request, which must not wait for captures
        start = time.monotonic()
        captured = engine.runner.decode_graphs.capture_all()
        log.info("captured %d decode graphs in %.1f s", captured, time.monotonic() - start)
    mc = engine.model_config
    outbox.put(wire.WorkerReady(model=args.served_model_name, architecture=mc.architecture, dtype=str(engine.dtype).removeprefix("torch."),
                                device=str(engine.device),
                                attention_backend=engine.attention_backend.name, quantization=engine.quantization,
                                activation_quantization=engine.activation_quantization,
                                decode_graphs=engine.runner.decode_graphs_status, layer_ops=engine.layer_ops.name,
                                speculative_decoding=engine.speculative,
                                max_model_len=engine.max_model_len,
                                vocab_size=mc.vocab_size, stats=engine.stats()))
    try:
        _engine_loop(engine, inbox, outbox, args.enable_debug_faults)
    finally:
        outbox.put(_STOP)
        sender.join(timeout=2)
    return 0


def _engine_loop(engine: LLMEngine, inbox: queue.Queue, outbox: queue.Queue, debug_faults: bool = False) -> None:
    while True:
        messages = []
        if not engine.has_unfinished_requests():
            try:
                messages.append(inbox.get(timeout=HEARTBEAT_S))
            except queue.Empty:
                engine.check_kv()  # steps audit as they go; an idle engine is audited here
                outbox.put(wire.Heartbeat(stats=engine.stats()))
                continue
        while True:
            try:
                messages.append(inbox.get_nowait())
            except queue.Empty:
                break
        for message in messages:
            if message is _STOP:
                return
            if isinstance(message, wire.DebugQuery):
                outbox.put(_debug_reply(engine, message, debug_faults))
            else:
                _handle(engine, message, outbox)
        if engine.has_unfinished_requests():
            outputs = engine.step()
            outbox.put(wire.StepOutputs(deltas=[_delta(o) for o in outputs], stats=engine.stats()))


def _handle(engine: LLMEngine, message, outbox: queue.Queue) -> None:
    if isinstance(message, wire.AbortRequests):
        for request_id in message.request_ids:
            engine.abort_request(request_id)
        return
    if isinstance(message, wire.AbortChoices):
        for index in message.indices:
            engine.abort_choice(message.request_id, index)
        return
    try:
        params = wire.sampling_params_from_wire(message.params)
        deadline = None if message.timeout_s is None else time.monotonic() + message.timeout_s
        engine.add_request(message.request_id, message.prompt_token_ids, params, deadline=deadline,
                           tenant=message.tenant, tenant_weight=message.tenant_weight)
    except (RequestRejected, SamplingParamsError) as e:
        outbox.put(wire.RequestFailed(request_id=message.request_id, message=str(e), param=e.param))
    except wire.WireError as e:
        outbox.put(wire.RequestFailed(request_id=message.request_id, message=str(e)))
    except Exception as e:  # a check missed above; add_request changes nothing before it fails: refuse, go on
        log.exception("request %r could not be added", message.request_id)
        outbox.put(wire.RequestFailed(request_id=message.request_id, message=f"the worker could not add it: {e}"))


def _debug_reply(engine: LLMEngine, query: wire.DebugQuery, debug_faults: bool) -> wire.DebugReply:
    if query.what == "kv_ledger":
        return wire.DebugReply(token=query.token, body=engine.kv_ledger())
    if query.what == "inject_kv_fault":
        if not debug_faults:
            return wire.DebugReply(token=query.token, body={}, error="fault injection is off (--enable-debug-faults)")
        try:
            done = engine.inject_kv_fault(query.arg or "")
        except ValueError as e:
            return wire.DebugReply(token=query.token, body={}, error=str(e))
        log.warning("injected a KV accounting fault on request: %s", done)
        return wire.DebugReply(token=query.token, body={"injected": done})
    return wire.DebugReply(token=query.token, body={}, error=f"unknown debug query {query.what!r}")


def _receive(ctx: zmq.Context, address: str, inbox: queue.Queue, outbox: queue.Queue, parent_pid: int) -> None:
    sock = ctx.socket(zmq.PULL)
    sock.connect(address)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    while True:
        if os.getppid() != parent_pid:
            log.warning("the gateway has gone away; exiting")
            inbox.put(_STOP)
            # The engine loop takes the stop between steps; a worker still loading its model never gets
            # there in time, and nothing it could still send has a reader.
            time.sleep(_EXIT_GRACE_S)
            os._exit(0)
        if not poller.poll(timeout=int(HEARTBEAT_S * 1000)):
            continue
        frame = sock.recv(copy=True)
        try:
            inbox.put(wire.decode(frame, (wire.AddRequest, wire.AbortRequests, wire.AbortChoices,
                                          wire.DebugQuery)))
        except wire.WireError as e:
            log.warning("rejected a frame from the gateway: %s", e)
            if e.request_id is not None:  # answer it, so the request does not wait forever
                outbox.put(wire.RequestFailed(request_id=e.request_id, message=f"malformed request: {e}"))


def _send(ctx: zmq.Context, address: str, outbox: queue.Queue) -> None:
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(address)
    while (message := outbox.get()) is not _STOP:
        sock.send(wire.encode(message), copy=False)
    sock.close()


def _delta(out: SequenceOutput) -> wire.TokenDelta:
    logprobs = None
    if out.logprobs is not None:
        logprobs = [[lp.token_id, lp.logprob, [list(t) for t in lp.top]] for lp in out.logprobs]
    prompt_logprobs = None
    if out.prompt_logprobs is not None:
        prompt_logprobs = [[lp.token_id, lp.logprob, lp.rank, [list(t) for t in lp.top]] for lp in out.prompt_logprobs]
    return wire.TokenDelta(request_id=out.request_id, index=out.index, token_ids=out.new_token_ids,
                           finish_reason=out.finish_reason, num_prompt_tokens=out.num_prompt_tokens,
                           num_cached_tokens=out.num_cached_tokens, logprobs=logprobs,
                           stop_token_id=out.stop_token_id, queue_time=out.queue_time,
                           prompt_logprobs=prompt_logprobs, pooled=out.pooled)


if __name__ == "__main__":
    sys.exit(main())
