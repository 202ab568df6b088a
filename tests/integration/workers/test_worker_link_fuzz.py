"""Fuzzed frames on both sockets of the worker link, against real processes: random, truncated,
bit-flipped, oversized and wrong-typed msgpack frames are refused and logged, and serving goes on.

- worker -> gateway: frames pushed into a real gateway's outputs socket, beside its real worker.
- gateway -> worker: a real worker process behind sockets this test binds (it plays the gateway), so
  fuzzed requests reach the worker's receiving thread and engine loop exactly as the gateway's would.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import httpx2
import zmq

from shared import wire
from shared.config import EngineConfig
from shared.sampling_params import SamplingParams
from tests.helpers.server import ROOT, Server
from tests.helpers.wire_fuzz import (delta_frames, fuzz_frames, gateway_to_worker_templates, oversized_frame,
                                     worker_to_gateway_templates)

FRAMES = 300
TO_WORKER = (wire.AddRequest, wire.AbortRequests)
TO_GATEWAY = (wire.WorkerReady, wire.StepOutputs, wire.Heartbeat, wire.RequestFailed)


def _refused(frames: list[bytes], allowed) -> int:
    count = 0
    for frame in frames:
        try:
            wire.decode(frame, allowed)
        except wire.WireError:
            count += 1
    return count


def _wait_for_log(read, needle: str, count: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while (seen := read().count(needle)) < count:
        assert time.monotonic() < deadline, f"{seen} of {count} {needle!r} logged"
        time.sleep(0.1)


def test_fuzzed_frames_into_the_gateway(tiny_model_dir, tmp_path, test_seed):
    server = Server(tiny_model_dir, "--served-model-name", "tiny", "--num-kv-blocks", "128",
                    log_path=tmp_path / "server.log").start()
    try:
        (worker,) = server.worker_pids()
        argv = Path(f"/proc/{worker}/cmdline").read_bytes().split(b"\0")
        outputs_address = argv[argv.index(b"--outputs") + 1].decode()
        max_model_len = server.wait_healthy()["max_model_len"]
        rng = random.Random(test_seed)
        frames = [f for _, f in fuzz_frames(rng, worker_to_gateway_templates(), FRAMES)]
        frames += delta_frames(rng, FRAMES // 4) + [oversized_frame()]
        refused = _refused(frames, TO_GATEWAY)
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PUSH)
        sock.connect(outputs_address)
        for frame in frames:
            sock.send(frame)
        sock.close(linger=5000)
        ctx.term()
        log = lambda: server.log_path.read_text(errors="replace")  # noqa: E731
        _wait_for_log(log, "rejected a frame from worker", refused)
        print(f"{len(frames)} frames into the gateway, {refused} refused at decoding")

        body = {"model": "tiny", "prompt": "still there?", "max_tokens": 5, "ignore_eos": True, "temperature": 0}
        ok = httpx2.post(f"{server.url}/v1/completions", json=body, timeout=60)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 5
        with httpx2.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            assert r.status_code == 200 and list(r.iter_lines())[-2:] in (["data: [DONE]", ""], ["", "data: [DONE]"])
        assert server.worker_pids() == [worker]
        assert server.wait_healthy()["max_model_len"] == max_model_len  # no forged WorkerReady took hold
        assert "Traceback" not in log()  # nothing that passed decoding broke the dispatch
    finally:
        server.stop()


class FakeGateway:
    """Binds the two sockets and runs one real worker process against them."""

    def __init__(self, model_dir: Path, tmp_path: Path):
        self.ctx = zmq.Context()
        self.requests = self.ctx.socket(zmq.PUSH)
        self.outputs = self.ctx.socket(zmq.PULL)
        requests_address, outputs_address = f"ipc://{tmp_path}/requests", f"ipc://{tmp_path}/outputs"
        self.requests.bind(requests_address)
        self.outputs.bind(outputs_address)
        config = EngineConfig(model=str(model_dir), dtype="float32", num_kv_blocks=64, max_num_seqs=8,
                              attention_backend="torch")
        self.log_path = tmp_path / "worker.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "worker.process", "--requests", requests_address, "--outputs", outputs_address,
             "--config", json.dumps(asdict(config)), "--served-model-name", "tiny", "--threads", "1",
             "--name", "fuzzed-worker"],
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=self._log, stderr=subprocess.STDOUT)

    def receive(self, timeout: float) -> wire.Message | None:
        if not self.outputs.poll(int(timeout * 1000)):
            return None
        return wire.decode(self.outputs.recv(), TO_GATEWAY)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._log.close()
        self.requests.close(linger=0)
        self.outputs.close(linger=0)
        self.ctx.term()


def _good(request_id: str) -> bytes:
    params = wire.sampling_params_to_wire(SamplingParams(n=2, max_tokens=4, temperature=0, ignore_eos=True))
    return wire.encode(wire.AddRequest(request_id=request_id, prompt_token_ids=[5, 6, 7], params=params))


def test_fuzzed_frames_into_a_worker(tiny_model_dir, tmp_path, test_seed):
    gateway = FakeGateway(tiny_model_dir, tmp_path)
    try:
        deadline = time.monotonic() + 180
        while not isinstance(gateway.receive(1.0), wire.WorkerReady):
            assert gateway.proc.poll() is None and time.monotonic() < deadline, gateway.log()[-2000:]
        frames = [f for _, f in fuzz_frames(random.Random(test_seed), gateway_to_worker_templates(), FRAMES)]
        frames.append(oversized_frame())
        refused = _refused(frames, TO_WORKER)
        answerable = 0  # refused frames whose request id could be read: the worker answers them
        for frame in frames:
            try:
                wire.decode(frame, TO_WORKER)
            except wire.WireError as e:
                answerable += e.request_id is not None
        gateway.requests.send(_good("good-0"))
        for frame in frames:
            gateway.requests.send(frame)
        gateway.requests.send(_good("good-1"))

        finished: dict[str, set[int]] = {}
        malformed_answers = 0
        deadline = time.monotonic() + 60
        while not all(len(finished.get(r, ())) == 2 for r in ("good-0", "good-1")):
            assert time.monotonic() < deadline and gateway.proc.poll() is None, gateway.log()[-3000:]
            message = gateway.receive(0.5)
            if isinstance(message, wire.StepOutputs):
                for delta in message.deltas:
                    if delta.finish_reason is not None:
                        finished.setdefault(delta.request_id, set()).add(delta.index)
            elif isinstance(message, wire.RequestFailed):
                malformed_answers += message.message.startswith("malformed request")
                assert not message.request_id.startswith("good-"), message
        _wait_for_log(gateway.log, "rejected a frame from the gateway", refused)
        deadline = time.monotonic() + 10
        while malformed_answers < answerable:  # the answers may trail the good requests
            assert time.monotonic() < deadline, (malformed_answers, answerable)
            message = gateway.receive(0.5)
            if isinstance(message, wire.RequestFailed):
                malformed_answers += message.message.startswith("malformed request")
        print(f"{len(frames)} frames into a worker, {refused} refused at decoding, {answerable} of them answered "
              f"with RequestFailed")
        assert gateway.proc.poll() is None
        assert "Traceback" not in gateway.log()
    finally:
        gateway.close()
