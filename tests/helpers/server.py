"""The real `mili serve` as a subprocess (gateway and worker processes, real sockets), for integration
and e2e tests; and tiny random models with a real tokenizer and chat template to serve."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any
from pathlib import Path

import httpx2

from loadtest.fixtures.probes import free_port, metric_total
from tests.helpers.tiny_models import build_tiny_model

ROOT = Path(__file__).resolve().parents[2]


def tokenizer_source_dir() -> Path:
    """Where the served tiny models' tokenizer.json and tokenizer_config.json come from: the default model's
    (converted once), or MILI_TEST_TOKENIZER_DIR holding copies of them, where the default model's package is
    not installed (the GPU check carries them: `make gpu-bundle`)."""
    if os.environ.get("MILI_TEST_TOKENIZER_DIR"):
        return Path(os.environ["MILI_TEST_TOKENIZER_DIR"])
    from shared.default_model import default_model_path

    return default_model_path()


def build_served_tiny_model(arch: str, seed: int, out_dir: Path, max_positions: int = 512,
                            vocab_size: int | None = None) -> Path:
    """A random tiny model with the default model's tokenizer and chat template (SmolLM2's ChatML, whose
    <|im_end|> is id 2, the tiny models' EOS)."""
    from tokenizers import Tokenizer

    source = tokenizer_source_dir()
    vocab = vocab_size or Tokenizer.from_file(str(source / "tokenizer.json")).get_vocab_size()
    build_tiny_model(arch, seed, out_dir, vocab_size=vocab, max_positions=max_positions)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, out_dir / name)
    return out_dir


def build_tagged_qwen3(seed: int, out_dir: Path, tags: list[str], chat_template: str,
                       max_positions: int = 512) -> dict[str, int]:
    """A served tiny Qwen3 whose tokenizer (the default model's) gains `tags` as added tokens, as Qwen3's
    has <think> and <tool_call>, served with `chat_template`; the tags' ids."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_source_dir() / "tokenizer.json"))
    tok.add_tokens([AddedToken(t, special=False) for t in tags])  # first, so the model's vocabulary covers them
    build_served_tiny_model("qwen3", seed, out_dir, max_positions=max_positions, vocab_size=tok.get_vocab_size())
    tok.save(str(out_dir / "tokenizer.json"))
    config = json.loads((out_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = chat_template
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return {t: tok.token_to_id(t) for t in tags}


class Server:
    """`mili serve` on a free port; `start()` returns once /health says ready."""

    def __init__(self, model: str | Path, *flags: str, log_path: Path, env: dict[str, str] | None = None):
        self.model = Path(model)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "gateway.cli", "serve", "--model", str(model), "--port", str(self.port),
                    "--dtype", "float32", *flags]
        self.log_path = log_path
        # The repository first; an existing path stays after it (the GPU check installs packages into one).
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        self.env = dict(os.environ, PYTHONPATH=path, **(env or {}))
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 180.0) -> "Server":
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT)
        self.wait_healthy(timeout)
        return self

    def wait_healthy(self, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mili serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                r = httpx2.get(f"{self.url}/health", timeout=2)
                if r.status_code == 200:
                    return r.json()
            except httpx2.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"mili serve not healthy after {timeout} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def worker_pids(self) -> list[int]:
        """The gateway's child processes (its workers)."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        return [int(p) for p in children]

    def answer(self, path: str, body: dict, status: int = 200, timeout: float = 60) -> Any:
        """POST `body` as JSON and the JSON answer, checking the status first (a failure shows the answer)."""
        r = httpx2.post(f"{self.url}{path}", json=body, headers=self.auth_headers(), timeout=timeout)
        assert r.status_code == status, r.text
        return r.json()

    def auth_headers(self) -> dict[str, str]:
        """The Authorization header every route but /health needs when the server has MILI_API_KEY."""
        key = self.env.get("MILI_API_KEY")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples that carry the given labels (0 when it has none yet)."""
        r = httpx2.get(f"{self.url}/metrics", headers=self.auth_headers(), timeout=5)
        r.raise_for_status()
        return metric_total(r.text, name, **labels)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self._log.close()


# Qwen's fill-in-the-middle and repository tokens, for a tiny model that can fill in the middle.
FIM_MARKERS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"]


def start_fim_qwen3(tmp_path_factory) -> tuple[Server, dict[str, int]]:
    """`mili serve` (served as "fim") on a tiny Qwen3 whose tokenizer has FIM_MARKERS, with the default model's chat
    template and a context past llama-server's infill batch of 2048 tokens, so /infill's prompt has room for other
    files; the server and the markers' ids."""
    template = json.loads((tokenizer_source_dir() / "tokenizer_config.json").read_text())["chat_template"]
    return start_tagged_qwen3(tmp_path_factory, "fim", FIM_MARKERS, template, "--served-model-name", "fim",
                              max_positions=4096)


def start_tagged_qwen3(tmp_path_factory, label: str, tags: list[str], chat_template: str,
                       *flags: str, max_positions: int = 512) -> tuple[Server, dict[str, int]]:
    """`mili serve` on a fresh random tiny Qwen3 with `tags` as added tokens (build_tagged_qwen3), under `flags`;
    the started server and the tags' ids. The model's seed is printed, to rerun a failure."""
    import random

    out = tmp_path_factory.mktemp(label) / f"tiny-{label}"
    out.mkdir()
    seed = random.randrange(2**31)
    print(f"\n[{label} model] seed={seed}")
    ids = build_tagged_qwen3(seed, out, tags, chat_template, max_positions)
    return Server(out, *flags, log_path=tmp_path_factory.mktemp("logs") / "server.log").start(), ids
