"""Opt-in: Anthropic's Claude Code CLI completes one prompt against `mili serve` through ANTHROPIC_BASE_URL.

Skipped unless MILI_CLAUDE_CODE is set to the `claude` executable, e.g. after
`npm install --prefix ~/.cache/claude-code @anthropic-ai/claude-code`:
MILI_CLAUDE_CODE=~/.cache/claude-code/node_modules/.bin/claude. Claude Code runs headless (`-p`) on a fresh HOME
(onboarding marked done, no telemetry), with every model alias pointed at the served model and its own tools and
system prompt (what its requests carry: tools with cache_control, adaptive thinking, context_management,
output_config). The served model is a tiny one scripted to answer "ok" and stop (tests/helpers/scripted_model.py):
Claude Code's prompt is larger than the default model's context, and Claude Code 2.1 treats an answer cut by its
output cap as an error once it has asked three times to resume, which a model that rambles (the default one does)
reaches.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.helpers.scripted_model import start_scripted_server

CLAUDE = os.environ.get("MILI_CLAUDE_CODE")
pytestmark = pytest.mark.skipif(not CLAUDE, reason="set MILI_CLAUDE_CODE to the claude executable to run")
MODEL = "smol"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_scripted_server(tmp_path_factory, MODEL)
    yield srv
    srv.stop()


def test_claude_code_completes_a_prompt_with_its_own_tools_and_prompt(server, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".claude.json").write_text(json.dumps({"hasCompletedOnboarding": True}))
    env = dict(os.environ, HOME=str(home), ANTHROPIC_BASE_URL=server.url, ANTHROPIC_AUTH_TOKEN="local",
               ANTHROPIC_MODEL=MODEL, ANTHROPIC_SMALL_FAST_MODEL=MODEL, ANTHROPIC_DEFAULT_HAIKU_MODEL=MODEL,
               ANTHROPIC_DEFAULT_SONNET_MODEL=MODEL, ANTHROPIC_DEFAULT_OPUS_MODEL=MODEL,
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", CLAUDE_CODE_ATTRIBUTION_HEADER="0")
    done = subprocess.run([os.path.expanduser(CLAUDE), "-p", "Reply with ok", "--output-format", "json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["is_error"] is False and result["result"].strip() == "ok", result
    assert "POST /v1/messages -> 200" in server.log_path.read_text()
