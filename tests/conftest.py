"""Shared fixtures: per-run random seeds (printed, replayable) and tiny random HF models on disk."""

from __future__ import annotations

import os
import random

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
