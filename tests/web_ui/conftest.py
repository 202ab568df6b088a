"""The browser tests skip (fail under CI) before any server starts where chromium cannot be had."""

from __future__ import annotations

import pytest

from tests.web_ui.browser import browser_paths


@pytest.fixture(scope="module", autouse=True)
def _browser_tools():
    browser_paths()
