"""Opt-in: Qwen Code (the Qwen team's agent CLI) completes one prompt against `mili serve` through its OpenAI
provider (chat completions, streamed, with its own tools and system prompt).

Skipped unless MILI_QWEN_CODE is set to the `qwen` executable, e.g. after
`npm install --prefix ~/.cache/qwen-code @qwen-code/qwen-code`: MILI_QWEN_CODE=~/.cache/qwen-code/node_modules/.bin/qwen.
It runs headless (`-p`) on a fresh HOME with OPENAI_BASE_URL / OPENAI_MODEL, as its docs configure a local server.
The served model is a tiny one scripted to answer "ok" and stop (tests/helpers/scripted_model.py): Qwen Code's
prompt is larger than the default model's context.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.helpers.scripted_model import start_scripted_server

QWEN_CODE = os.environ.get("MILI_QWEN_CODE")
pytestmark = pytest.mark.skipif(not QWEN_CODE, reason="set MILI_QWEN_CODE to the qwen executable to run")
MODEL = "qwen-local"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_scripted_server(tmp_path_factory, MODEL)
    yield srv
    srv.stop()


def test_qwen_code_completes_a_prompt(server, tmp_path):
    (tmp_path / "home").mkdir()
    env = dict(os.environ, HOME=str(tmp_path / "home"), OPENAI_API_KEY="local", OPENAI_BASE_URL=f"{server.url}/v1",
               OPENAI_MODEL=MODEL)
    done = subprocess.run([os.path.expanduser(QWEN_CODE), "-p", "Reply with ok"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "ok", done.stdout[-2000:]
    assert "POST /v1/chat/completions -> 200" in server.log_path.read_text()
