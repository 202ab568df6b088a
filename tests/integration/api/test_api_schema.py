"""Schemathesis over the live /openapi.json: every check it has, bounded cases, zero failures.

The document is generated from the request models that validate (gateway/openapi.py), so this test
holds the server to its own description: no 5xx, documented status codes and content types (JSON, or
text/event-stream when stream is true), responses matching their schemas, every schema-valid request
accepted, every schema-invalid one refused. The hooks module (tests/helpers/schemathesis_hooks.py) leaves
out only cases that break a documented rule JSON Schema cannot state, and caps generation at 16 tokens.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest

from tests.helpers.pooling_models import build_embedding_model, build_reranker_model
from tests.helpers.server import Server, start_fim_qwen3

ROOT = Path(__file__).resolve().parents[3]
# The CLI as a module of this interpreter (a console script's shebang would pin the venv's path).
ST = [sys.executable, "-m", "schemathesis.cli"]
# Fuzzing cases per operation; the coverage phase adds its own boundary cases (several hundred in all).
MAX_EXAMPLES = int(os.environ.get("MILI_SCHEMATHESIS_EXAMPLES", "30"))
# On the embedding and scoring servers, whose routes share most of their bodies' parts: the coverage phase's
# boundary cases and fewer fuzzed ones, to keep the suite's time.
POOLING_EXAMPLES = max(1, MAX_EXAMPLES // 3)
# A deadline the client sets (X-Request-Timeout, down to 5e-324 s) is answered with the documented 504.
# The shared server runs without --stream-resume-ttl, so every stream id is unknown there (the documented
# 404): the resume route's behaviour is tested in test_stream_resume.py, and its "always 404" warning is off.
CONFIG = """
[checks.not_a_server_error]
expected-statuses = ["2xx", "3xx", "4xx", "504"]

[[operations]]
include-path = "/v1/streams/{stream_id}"
warnings = false

# Stored responses: only an id POST /v1/responses returned (with store: true) is found, so generated ids are the
# documented 404 (retrieval, items and deletion: test_responses_sdk.py); the "always 404" warning is off.
[[operations]]
include-path-regex = "^/v1/responses/"
warnings = false
"""


# An embedding or scoring server answers no generation routes (so no stored responses and no streams to resume); GET
# /v1/models/{model} finds only the served name, which the generator does not guess (the documented 404).
EMBED_CONFIG = """
[checks.not_a_server_error]
expected-statuses = ["2xx", "3xx", "4xx", "504"]

[[operations]]
include-path-regex = "^/v1/(models|streams)/"
warnings = false
"""


def second_spellings(paths: dict) -> list[str]:
    """The document's paths whose description is an earlier path's, word for word: one handler answering two
    spellings (llama.cpp's /completion and /completions, /v1/score and /score, ...; gateway/app.py)."""
    first: dict[str, str] = {}
    return [path for path, item in paths.items() if first.setdefault(json.dumps(item, sort_keys=True), path) != path]


def with_second_spellings(config_text: str, paths: dict) -> str:
    """`config_text` where each second spelling is fuzzed but skips the coverage phase's boundary cases, which the
    first spelling's run already sends to that handler."""
    return config_text + "".join(f'\n[[operations]]\ninclude-path = "{path}"\nphases.coverage.enabled = false\n'
                                 for path in second_spellings(paths))


# The phases as two schemathesis processes at once. The fuzzing phase's time is the client's own generation
# (hypothesis, in one process, one core busy); the other phases' cases are cheap to generate and cost the server,
# so they fit beside it on the second core. One process ran them all in turn, about 1.5x the time.
PHASE_GROUPS = ("examples,coverage,stateful", "fuzzing")


def phase_folder(tmp_path: Path, group: str) -> Path:
    """Where a phase group's process runs: its schemathesis.toml and the hooks' dropped.json."""
    return tmp_path / group.replace(",", "-")


def run_schemathesis(url: str, tmp_path: Path, seed: int, context: int, tokenizer: Path, *options: str,
                     config_text: str = CONFIG, examples: int = MAX_EXAMPLES) -> list[subprocess.CompletedProcess]:
    """Each of PHASE_GROUPS run against `url` at once, each in its phase_folder; their results in that order."""
    runs = []
    for group in PHASE_GROUPS:
        folder = phase_folder(tmp_path, group)
        folder.mkdir()
        (folder / "schemathesis.toml").write_text(config_text)
        env = dict(os.environ, PYTHONPATH=str(ROOT), SCHEMATHESIS_HOOKS="tests.helpers.schemathesis_hooks",
                   MILI_SCHEMATHESIS_CONTEXT=str(context), MILI_SCHEMATHESIS_DROPPED=str(folder / "dropped.json"),
                   MILI_SCHEMATHESIS_TOKENIZER=str(tokenizer))
        cmd = [*ST, "--no-color", "--config-file", str(folder / "schemathesis.toml"), "run", f"{url}/openapi.json",
               "--phases", group, "--checks", "all", "--max-examples", str(examples), "--seed", str(seed),
               "--workers", "1", "--request-timeout", "60", "--no-shrink", "--continue-on-failure",
               "--output-truncate", "true", "--output-sanitize", "false",
               # One worker: with two, schemathesis's coverage phase now and then raised a KeyError inside its own
               # schema walk (an error of the tool, reported as an error, not a finding).
               # Generated conversations are often longer than the tiny model's context (those are left out), and
               # big bodies are slow to generate on a busy machine.
               "--suppress-health-check", "filter_too_much,too_slow", *options]
        runs.append((cmd, subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True)))
    try:
        outputs = [proc.communicate(timeout=400) for _, proc in runs]
        return [subprocess.CompletedProcess(cmd, proc.returncode, *out) for (cmd, proc), out in zip(runs, outputs)]
    finally:
        for _, proc in runs:  # one timed out: the other is not left running
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_schemathesis_finds_nothing(server, tmp_path):
    _finds_nothing(server, tmp_path)


@pytest.fixture(scope="module")
def fim_server(tmp_path_factory):
    srv, _ = start_fim_qwen3(tmp_path_factory)
    yield srv
    srv.stop()


def test_schemathesis_finds_nothing_in_infill(fim_server, tmp_path):
    """llama.cpp's /infill is described only where the tokenizer has fill-in-the-middle tokens (the shared server's
    has none): here it is, on a model whose tokenizer has Qwen's."""
    paths = httpx2.get(f"{fim_server.url}/openapi.json", timeout=10).json()["paths"]
    assert "/infill" in paths
    _finds_nothing(fim_server, tmp_path, "--include-path", "/infill")


def _serve_random_model(tmp_path_factory, name: str, build, max_model_len: int):
    """`mili serve` on a model `build(out_dir, seed)` makes from a fresh seed (printed, or MILI_TEST_SEED's);
    yields the server and stops it after the module."""
    seed = int(os.environ.get("MILI_TEST_SEED", random.randrange(2**31)))
    print(f"\n[{name}] MILI_TEST_SEED={seed}")
    model = build(tmp_path_factory.mktemp(name) / name, seed)
    srv = Server(model, "--max-model-len", str(max_model_len), log_path=tmp_path_factory.mktemp("logs") / f"{name}.log")
    yield srv.start()
    srv.stop()


@pytest.fixture(scope="module")
def embedding_server(tmp_path_factory):
    yield from _serve_random_model(tmp_path_factory, "tiny-embed",
                                   lambda out, seed: build_embedding_model(out, seed, "mean", normalize=True), 128)


def test_schemathesis_finds_nothing_on_an_embedding_server(embedding_server, tmp_path):
    """--task embed answers other routes (OpenAI's, Ollama's, TEI's and llama.cpp's embeddings); so does its
    document."""
    _finds_nothing(embedding_server, tmp_path, config_text=EMBED_CONFIG, examples=POOLING_EXAMPLES)


@pytest.fixture(scope="module")
def scoring_server(tmp_path_factory):
    yield from _serve_random_model(tmp_path_factory, "tiny-Qwen3-Reranker", build_reranker_model, 256)


def test_schemathesis_finds_nothing_on_a_scoring_server(scoring_server, tmp_path):
    """--task score: Jina's, Cohere's (v1 and v2), TEI's and vLLM's rerank and score routes."""
    _finds_nothing(scoring_server, tmp_path, config_text=EMBED_CONFIG, examples=POOLING_EXAMPLES)


def _finds_nothing(server, tmp_path: Path, *options: str, config_text: str = CONFIG,
                   examples: int = MAX_EXAMPLES) -> None:
    seed = int(os.environ.get("MILI_TEST_SEED", random.randrange(2**31)))
    context = httpx2.get(f"{server.url}/health", timeout=10).json()["max_model_len"]
    paths = httpx2.get(f"{server.url}/openapi.json", timeout=10).json()["paths"]
    results = run_schemathesis(server.url, tmp_path, seed, context, server.model / "tokenizer.json", *options,
                               config_text=with_second_spellings(config_text, paths), examples=examples)
    print(f"\nsecond spellings (no coverage phase): {second_spellings(paths)}")
    for group, result in zip(PHASE_GROUPS, results):
        summary = [line for line in result.stdout.splitlines() if "generated" in line or "passed" in line]
        dropped_file = phase_folder(tmp_path, group) / "dropped.json"
        dropped = json.loads(dropped_file.read_text()) if dropped_file.exists() else {}
        print(f"\nschemathesis seed {seed}, {group}: {' | '.join(s.strip() for s in summary)}; left out: {dropped}")
        assert result.returncode == 0, result.stdout[-12000:] + result.stderr[-3000:]
        assert "No issues found" in result.stdout, result.stdout[-6000:]
    assert httpx2.get(f"{server.url}/health", timeout=10).status_code == 200
