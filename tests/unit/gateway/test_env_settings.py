"""`mili serve` settings from the environment (what the container image and Kubernetes set): MILI_HOST,
MILI_PORT, MILI_MODEL, MILI_API_KEY, and MILI_ATTENTION_BACKEND (what the GPU check sets when the GPU
attention module fails its check); a flag on the command line wins; the default host stays loopback."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.serve import add_arguments

ENV = ("MILI_HOST", "MILI_PORT", "MILI_MODEL", "MILI_API_KEY", "MILI_ATTENTION_BACKEND")


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)  # reads the environment when the defaults are built, as `mili serve` does
    return p.parse_args(list(argv))


@pytest.fixture
def clean_env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_defaults_without_environment(clean_env):
    args = parse()
    assert (args.host, args.port, args.model, args.api_key) == ("127.0.0.1", 8000, "default", None)
    assert args.attention_backend == "auto"


def test_environment_sets_defaults(clean_env):
    for name, value in zip(ENV, ("0.0.0.0", "9100", "/models/qwen3", "s3cret", "torch")):
        clean_env.setenv(name, value)
    args = parse()
    assert (args.host, args.port, args.model, args.api_key) == ("0.0.0.0", 9100, "/models/qwen3", "s3cret")
    assert args.attention_backend == "torch"


def test_flags_win_over_environment(clean_env):
    for name, value in zip(ENV, ("0.0.0.0", "9100", "/models/qwen3", "s3cret", "torch")):
        clean_env.setenv(name, value)
    args = parse("--host", "127.0.0.2", "--port", "9200", "--model", "default", "--api-key", "other",
                 "--attention-backend", "mojo")
    assert (args.host, args.port, args.model, args.api_key) == ("127.0.0.2", 9200, "default", "other")
    assert args.attention_backend == "mojo"


def test_bad_port_in_environment_is_a_usage_error(clean_env):
    env = {"MILI_PORT": "eighty", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "serve"], env=env, capture_output=True, text=True,
                            timeout=60, cwd=Path(__file__).resolve().parents[3])
    assert result.returncode == 2 and "--port: invalid int value: 'eighty'" in result.stderr, result.stderr


def test_bad_attention_backend_in_environment_is_a_usage_error(clean_env):
    env = {"MILI_ATTENTION_BACKEND": "fast", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "serve"], env=env, capture_output=True, text=True,
                            timeout=60, cwd=Path(__file__).resolve().parents[3])
    assert result.returncode == 2 and "--attention-backend: invalid choice: 'fast'" in result.stderr, result.stderr
