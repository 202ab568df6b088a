"""One real `mili serve` on a random tiny Qwen3 model, shared by the integration tests that do not
break it; tests that kill or drain a server start their own."""

from __future__ import annotations

import os
import random

import pytest

from tests.helpers.server import Server, build_served_tiny_model

SERVED_NAME = "tiny-qwen3"
# Small enough that a handful of long requests fill the batch and later ones queue.
SHARED_FLAGS = ("--served-model-name", SERVED_NAME, "--num-kv-blocks", "512", "--max-num-seqs", "16",
                "--max-num-batched-tokens", "256", "--max-n", "4", "--max-stop-strings", "4",
                "--max-stop-length", "32", "--max-body-size", "256KiB", "--sse-ping-interval", "0.2")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    seed = int(os.environ.get("MILI_TEST_SEED", random.randrange(2**31)))
    print(f"\n[tiny served model] MILI_TEST_SEED={seed}")
    return build_served_tiny_model("qwen3", seed, tmp_path_factory.mktemp("served") / "tiny-qwen3")


def device_flags(device: str | None) -> tuple[str, ...]:
    return ("--device", device) if device else ()


@pytest.fixture(scope="session")
def server_device(pytestconfig) -> str | None:
    """--server-device (the GPU check passes cuda); those tests skip where that device cannot be had."""
    device = pytestconfig.getoption("--server-device")
    if device and device.startswith("cuda"):
        import torch

        from worker.model.devices import cuda_unavailable_reason

        reason = cuda_unavailable_reason(torch.device(device))
        if reason is not None:
            pytest.skip(f"--server-device {device}: {reason}")
    return device


@pytest.fixture(scope="session")
def server(server_device, tiny_model_dir, tmp_path_factory):
    flags = SHARED_FLAGS + device_flags(server_device)
    srv = Server(tiny_model_dir, *flags, log_path=tmp_path_factory.mktemp("logs") / "server.log").start()
    yield srv
    srv.stop()
