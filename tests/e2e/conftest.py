"""The e2e tests' server: `mili serve` with no --model (the embedded default, in the default dtype, as
`make serve` runs it), one for every module here that does not start its own (it is stopped after the last), and
the official openai SDK against it."""

from __future__ import annotations

import openai
import pytest

from tests.helpers.server import Server

MODEL = "SmolLM2-135M-Instruct"


# One server for the package, not one a module: a start of the default model costs about 5 s, and these tests
# ask only what any request gets, each its own conversation, and read no counter as an exact count.
@pytest.fixture(scope="package")
def server(tmp_path_factory):
    srv = Server("default", "--dtype", "auto", log_path=tmp_path_factory.mktemp("e2e") / "server.log").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)
