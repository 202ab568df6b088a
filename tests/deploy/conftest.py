"""A real `mili serve` on a random tiny model for the deploy tests, configured the way the container image and
Kubernetes configure it: through MILI_HOST, MILI_PORT and MILI_MODEL rather than flags."""

from __future__ import annotations

import os
import random
import sys

import pytest

from tests.helpers.server import Server, build_served_tiny_model

SERVED_NAME = "tiny-deploy"
FLAGS = ("--served-model-name", SERVED_NAME, "--dtype", "float32", "--num-kv-blocks", "256", "--max-num-seqs", "4",
         "--max-num-batched-tokens", "256")


@pytest.fixture(scope="session")
def deploy_model_dir(tmp_path_factory):
    seed = int(os.environ.get("MILI_TEST_SEED", random.randrange(2**31)))
    print(f"\n[tiny deploy model] MILI_TEST_SEED={seed}")
    return build_served_tiny_model("qwen3", seed, tmp_path_factory.mktemp("deploy-model") / "tiny-qwen3")


def env_configured_server(model_dir, log_path, *flags: str) -> Server:
    """A Server whose model, host and port come from the environment only."""
    server = Server(model_dir, log_path=log_path)
    server.env.update(MILI_MODEL=str(model_dir), MILI_HOST="127.0.0.1", MILI_PORT=str(server.port))
    server.cmd = [sys.executable, "-m", "gateway.cli", "serve", *FLAGS, *flags]
    return server


@pytest.fixture(scope="session")
def mili(deploy_model_dir, tmp_path_factory):
    """Shared by the deploy tests; none of them breaks it."""
    server = env_configured_server(deploy_model_dir, tmp_path_factory.mktemp("logs") / "mili.log").start()
    yield server
    server.stop()
