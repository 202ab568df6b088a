"""Shared fixtures: per-run random seeds (printed, replayable) and tiny random HF models on disk."""

from __future__ import annotations

import os
import random
import shutil
import tempfile

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config):
    """The run's conversions (the default model's, and every random GGUF a test serves) go to a cache of its own,
    removed at the end, not into the user's ~/.cache/mili: each GGUF converts once per run (the default model in
    about 2.5 s), and no run leaves gigabytes behind. MILI_CACHE_DIR, when set, is used as it is."""
    if "MILI_CACHE_DIR" not in os.environ:
        config._mili_cache = tempfile.mkdtemp(prefix="mili-test-cache-")
        os.environ["MILI_CACHE_DIR"] = config._mili_cache


def pytest_unconfigure(config):
    cache = getattr(config, "_mili_cache", None)
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)
        os.environ.pop("MILI_CACHE_DIR", None)


def pytest_addoption(parser):
    parser.addoption("--server-device", default=None, metavar="DEVICE",
                     help="start the shared integration server with --device DEVICE (e.g. cuda; the GPU check "
                          "runs tests/integration/api/test_api.py so); default: mili serve's own, auto")


@pytest.fixture
def test_seed(request) -> int:
    """A fresh seed per test run; MILI_TEST_SEED=<n> replays a failure."""
    seed = int(os.environ.get("MILI_TEST_SEED", random.randrange(2**31)))
    print(f"\n[{request.node.name}] MILI_TEST_SEED={seed}")
    request.node.user_properties.append(("MILI_TEST_SEED", seed))
    return seed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Put the seed into the failure report, so a red CI log says how to replay it."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for name, value in item.user_properties:
            if name == "MILI_TEST_SEED":
                report.sections.append(("replay", f"MILI_TEST_SEED={value}"))
