"""The e2e tests' server: `mili serve` with no --model (the embedded default, in the default dtype, as
`make serve` runs it), one per test module, and the official openai SDK against it."""

from __future__ import annotations

import openai
import pytest

from tests.helpers.server import Server

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server("default", "--dtype", "auto", log_path=tmp_path_factory.mktemp("e2e") / "server.log").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)
