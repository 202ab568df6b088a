"""Process lifecycle with real processes: a worker killed mid-stream, a gateway killed under its workers,
SIGTERM draining, and several workers behind one gateway."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx2
import pytest

from tests.helpers.server import Server
from tests.helpers.sse import chunks

NAME = "tiny-qwen3"
LONG = {"model": NAME, "prompt": "keep talking", "max_tokens": 400, "ignore_eos": True, "temperature": 0,
        "stream": True}


def start(tiny_model_dir, tmp_path, *flags) -> Server:
    return Server(tiny_model_dir, "--served-model-name", NAME, "--num-kv-blocks", "256", *flags,
                  log_path=tmp_path / "server.log").start()


def wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still alive after {timeout} s")


def test_worker_crash_ends_streams_then_recovers(tiny_model_dir, tmp_path):
    server = start(tiny_model_dir, tmp_path)
    try:
        (worker,) = server.worker_pids()
        with httpx2.stream("POST", f"{server.url}/v1/completions", json=LONG, timeout=30) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))  # decoding now
            killed_at = time.monotonic()
            os.kill(worker, signal.SIGKILL)
            rest = list(lines)
        got = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
        assert "error" in got[-1] and rest[-1 if rest[-1] else -2] == "data: [DONE]"
        assert time.monotonic() - killed_at < 1.5  # the stream ended promptly, not at a timeout
        health = httpx2.get(f"{server.url}/health")
        assert health.status_code == 503 and "exited" in health.json()["reason"]
        refused = httpx2.post(f"{server.url}/v1/completions", json={**LONG, "stream": False, "max_tokens": 2})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "worker_unavailable"
        assert server.metric("mili_worker_up") == 0
        server.wait_healthy(timeout=60)  # restarted after the backoff
        assert server.worker_pids() != [worker]
        ok = httpx2.post(f"{server.url}/v1/completions", json={**LONG, "stream": False, "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
    finally:
        server.stop()


def test_workers_exit_when_the_gateway_dies(tiny_model_dir, tmp_path):
    server = start(tiny_model_dir, tmp_path, "--workers", "2")
    workers = server.worker_pids()
    assert len(workers) == 2
    server.proc.kill()
    server.proc.wait()
    for pid in workers:
        wait_gone(pid, timeout=5)


def test_sigterm_drains_running_streams(tiny_model_dir, tmp_path):
    server = start(tiny_model_dir, tmp_path, "--drain-timeout", "30")
    result: dict = {}

    def consume():
        with httpx2.stream("POST", f"{server.url}/v1/completions", json={**LONG, "max_tokens": 200},
                           timeout=60) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            result["started"] = True
            result["lines"] = list(lines)

    reader = threading.Thread(target=consume)
    reader.start()
    deadline = time.monotonic() + 30
    while "started" not in result:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    idle = httpx2.Client(base_url=server.url, timeout=2)  # a keep-alive connection, idle at SIGTERM
    assert idle.get("/health").status_code == 200
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    with pytest.raises(httpx2.HTTPError):  # the listening socket is closed: no new requests
        httpx2.get(f"{server.url}/health", timeout=2)
    with pytest.raises(httpx2.HTTPError):  # and idle connections are closed: no 503 through them either
        idle.get("/health")
    idle.close()
    reader.join(timeout=60)
    got = chunks(["data: {}"] + result["lines"])[1:]
    assert [c["choices"][0]["finish_reason"] for c in got if c["choices"] and c["choices"][0]["finish_reason"]] \
        == ["length"]
    # uvicorn re-raises the SIGTERM it handled once the drain is done, as a signal-terminated process.
    assert server.proc.wait(timeout=30) in (0, -signal.SIGTERM)
    assert "Traceback" not in server.log_tail(200)


def test_requests_spread_over_two_workers(tiny_model_dir, tmp_path):
    server = start(tiny_model_dir, tmp_path, "--workers", "2")
    try:
        deadline = time.monotonic() + 60  # /health is 200 once the first worker is ready
        while server.wait_healthy()["workers_ready"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        body = {**LONG, "stream": False, "max_tokens": 60}
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            texts = list(pool.map(lambda _: httpx2.post(f"{server.url}/v1/completions", json=body, timeout=60)
                                  .json()["choices"][0]["text"], range(8)))
        assert len(set(texts)) == 1  # greedy: the same answer from either worker
        assert server.metric("mili_kv_blocks_total") == 512  # two workers' caches
    finally:
        server.stop()


def test_queue_full_is_503_with_retry_after(tiny_model_dir, tmp_path):
    # One sequence at a time and no waiting room: of 8 simultaneous requests, the first is admitted and
    # the others arrive while it runs (a 400-token answer takes tens of milliseconds even on a tiny model).
    server = start(tiny_model_dir, tmp_path, "--max-num-seqs", "1", "--max-waiting-requests", "0")
    try:
        body = {**LONG, "stream": False}
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(lambda _: httpx2.post(f"{server.url}/v1/completions", json=body, timeout=60),
                                      range(8)))
        refused = [r for r in responses if r.status_code == 503]
        assert refused and all(r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "queue_full"
                               for r in refused)
        assert {r.status_code for r in responses} <= {200, 503} and any(r.status_code == 200 for r in responses)
        ok = httpx2.post(f"{server.url}/v1/completions", json={**body, "max_tokens": 2})
        assert ok.status_code == 200
    finally:
        server.stop()


def test_junk_frames_on_the_worker_link_are_refused_and_serving_goes_on(tiny_model_dir, tmp_path):
    import msgpack
    import zmq

    server = start(tiny_model_dir, tmp_path)
    try:
        (worker,) = server.worker_pids()
        argv = Path(f"/proc/{worker}/cmdline").read_bytes().split(b"\0")
        outputs_address = argv[argv.index(b"--outputs") + 1].decode()
        assert outputs_address.startswith("ipc://")
        assert os.stat(outputs_address[len("ipc://"):].rsplit("/", 1)[0]).st_mode & 0o077 == 0  # private dir
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PUSH)
        sock.connect(outputs_address)
        for junk in (b"\xc1 not msgpack", msgpack.packb({"type": "exec", "code": "import os"}),
                     msgpack.packb({"type": "outputs", "deltas": [{"request_id": "x"}], "stats": {}}),
                     msgpack.packb([1, 2, 3])):
            sock.send(junk)
        sock.close(linger=1000)
        ctx.term()
        deadline = time.monotonic() + 5
        while server.log_tail(400).count("rejected a frame from worker") < 4:
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.05)
        ok = httpx2.post(f"{server.url}/v1/completions", json={**LONG, "stream": False, "max_tokens": 3})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
        assert server.worker_pids() == [worker]
    finally:
        server.stop()


def test_worker_link_over_tcp_when_asked(tiny_model_dir, tmp_path):
    from tests.helpers.server import free_port

    port = free_port()
    server = start(tiny_model_dir, tmp_path, "--worker-tcp", f"127.0.0.1:{port}")
    try:
        (worker,) = server.worker_pids()
        argv = Path(f"/proc/{worker}/cmdline").read_bytes().split(b"\0")
        assert argv[argv.index(b"--requests") + 1].decode() == f"tcp://127.0.0.1:{port}"
        ok = httpx2.post(f"{server.url}/v1/completions", json={**LONG, "stream": False, "max_tokens": 3})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
    finally:
        server.stop()


def test_a_taken_worker_address_is_reported_and_retried(tiny_model_dir, tmp_path):
    """Another process listens on the worker's outputs address: /health says so (503, with the address) and the
    log says so, and the worker starts once the address is free. Before, the failed bind ended the slot's
    supervisor silently and the server said "starting" for ever."""
    import socket

    from tests.helpers.server import free_port

    # The outputs address is the --worker-tcp port + 1: a free port whose next one is free too (the OS hands out
    # ports in no order, so the next one may belong to another process; take another pair then).
    for _ in range(100):
        port = free_port()
        blocker = socket.socket()
        try:
            blocker.bind(("127.0.0.1", port + 1))
            break
        except OSError:
            blocker.close()
    else:
        pytest.fail("no free port with a free next one in 100 tries")
    taken = f"tcp://127.0.0.1:{port + 1}"
    blocker.listen()
    server = Server(tiny_model_dir, "--served-model-name", NAME, "--worker-tcp", f"127.0.0.1:{port}",
                    log_path=tmp_path / "server.log")
    starting = threading.Thread(target=server.start)
    starting.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                health = httpx2.get(f"{server.url}/health", timeout=2)
                if taken in health.json().get("reason", ""):
                    break
            except httpx2.HTTPError:
                pass
            assert time.monotonic() < deadline, "/health never named the taken address"
            time.sleep(0.2)
        assert health.status_code == 503 and "Address already in use" in health.json()["reason"]
        blocker.close()
        starting.join(120)
        assert httpx2.get(f"{server.url}/health", timeout=5).status_code == 200
        assert f"cannot start worker 0: Address already in use (addr='{taken}'); retrying in" in server.log_tail(100_000)
        ok = httpx2.post(f"{server.url}/v1/completions", json={**LONG, "stream": False, "max_tokens": 3})
        assert ok.status_code == 200
    finally:
        blocker.close()
        starting.join(120)
        server.stop()
