"""The workers' ipc directory exists only while the pool runs: an application that is built but never started
(a test client, a startup that fails) leaves nothing in the temporary directory."""

from __future__ import annotations

import os
import stat
import tempfile

from gateway.workers.link import Transport
from gateway.workers.pool import WorkerPool
from shared.config import EngineConfig


def test_a_pool_that_never_starts_makes_no_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    pool = WorkerPool(EngineConfig(model="unused"), "m")
    pool.zmq_ctx.term()
    assert list(tmp_path.iterdir()) == []


def test_ipc_directory_is_private_while_open_and_gone_after_close(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    transport = Transport()
    transport.open()
    directory = transport.ipc_dir
    assert directory is not None and os.path.dirname(directory) == str(tmp_path)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    requests, outputs = transport.addresses(0, 3)
    assert requests == f"ipc://{directory}/w0-g3-requests" and outputs == f"ipc://{directory}/w0-g3-outputs"
    transport.open()  # a second open keeps the directory its sockets are in
    assert transport.ipc_dir == directory
    transport.close()
    assert not os.path.exists(directory) and transport.ipc_dir is None


def test_tcp_transport_makes_no_directory():
    transport = Transport(tcp_host="127.0.0.1", tcp_port=7000)
    transport.open()
    assert transport.ipc_dir is None
    assert transport.addresses(1, 0) == ("tcp://127.0.0.1:7002", "tcp://127.0.0.1:7003")
