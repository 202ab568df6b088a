"""Opt-in: OpenAI's Codex CLI runs one agent turn against `mili serve` through the Responses API.

Skipped unless MILI_CODEX is set to the `codex` executable, e.g. after
`npm install --prefix ~/.cache/codex @openai/codex`: MILI_CODEX=~/.cache/codex/node_modules/.bin/codex. Codex runs
headless (`codex exec`) on a fresh CODEX_HOME with a custom model provider (wire_api "responses") and its defaults
otherwise: its own prompt (about 9,100 tokens), its tools in namespaces, its hosted web search, its client_metadata.
The served model is scripted to answer "ok" and stop (tests/helpers/scripted_model.py): Codex's prompt is longer
than the default model's context, and a model that stops is what lets the turn end.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.helpers.scripted_model import start_scripted_server

CODEX = os.environ.get("MILI_CODEX")
pytestmark = pytest.mark.skipif(not CODEX, reason="set MILI_CODEX to the codex executable to run")
MODEL = "scripted"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_scripted_server(tmp_path_factory, MODEL)
    yield srv
    srv.stop()


def test_codex_runs_a_turn(server, tmp_path):
    env = dict(os.environ, CODEX_HOME=str(tmp_path / "codex-home"))
    (tmp_path / "codex-home").mkdir()
    provider = [f"model_provider={MODEL}", f'model_providers.{MODEL}.name="MILI"',
                f'model_providers.{MODEL}.base_url="{server.url}/v1"', f'model_providers.{MODEL}.wire_api="responses"',
                f"model={MODEL}"]
    done = subprocess.run([os.path.expanduser(CODEX), "exec", "--skip-git-repo-check",
                           *[arg for setting in provider for arg in ("-c", setting)], "Reply with ok"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "ok", done.stdout[-2000:]
    assert "POST /v1/responses -> 200" in server.log_path.read_text()
