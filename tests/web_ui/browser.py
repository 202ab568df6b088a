"""Debian's chromium, headless, driven through its chromedriver with Selenium: nothing is downloaded.

`make browser-tools` installs both (.ci/run does). Where either is missing the browser tests skip with the
reason, except under CI (CI=true), where they fail (tests/deploy/tools.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.deploy.tools import tool

# This machine's network is closed: without the background-networking flags chromium's own calls home stall it.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1000", "--force-device-scale-factor=1", "--lang=en-US")
HOW = "make browser-tools: apt-get install chromium chromium-driver"


def browser_paths() -> tuple[str, str]:
    """chromium's and chromedriver's paths, and selenium importable; else skip (fail under CI)."""
    pytest.importorskip("selenium", reason="selenium is a test dependency (pip install -e '.[test]')")
    return tool("chromium", HOW), tool("chromedriver", HOW)


def start_chromium(profile: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver_path), options=options)


def console_errors(driver, allowed: tuple[str, ...] = ()) -> list[str]:
    """The page's console errors since the last call (uncaught exceptions included), less those naming any of
    `allowed` (e.g. a 401 the page expects)."""
    return [e["message"] for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and not any(a in e["message"] for a in allowed)]


def local_storage(driver, key: str):
    text = driver.execute_script("return localStorage.getItem(arguments[0])", key)
    return None if text is None else json.loads(text)
