"""Debian's chromium, headless, driven through its chromedriver with Selenium (nothing is downloaded), and the
chat page's parts as its tests reach them.

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
         "--window-size=1400,1000", "--force-device-scale-factor=1", "--lang=en-US",
         "--disable-dev-shm-usage")  # containers' /dev/shm is often too small for chromium
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


# The chat page's parts, as its tests reach them.

def wait(driver, condition, timeout: float = 60, what: str = ""):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: condition(d), what)


def by_id(driver, element_id: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def text_of(driver, element_id: str) -> str:
    return by_id(driver, element_id).text


def answers(driver) -> list:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, "#messages .message.assistant")


def last_answer(driver, part: str = ".content") -> str | None:
    """The last answer's text (its `part`), read in one step in the page: while it streams the page redraws it
    every frame, so an element found a moment ago may already be replaced."""
    return driver.execute_script(
        "const all = document.querySelectorAll('#messages .message.assistant');"
        "const node = all.length ? all[all.length - 1].querySelector(arguments[0]) : null;"
        "return node ? node.innerText.replace('\u258d', '').trim() : null;", part)


def fill(driver, element_id: str, value: str) -> None:
    """Sets a settings field as typing would, and tells the page (its change event)."""
    field = by_id(driver, element_id)
    field.clear()
    if value:
        field.send_keys(value)
    driver.execute_script("arguments[0].dispatchEvent(new Event('change'))", field)


def open_page(driver, server) -> None:
    """A fresh load of the page with the key already given (the first test gives it)."""
    driver.get(server.url + "/")
    wait(driver, lambda d: d.find_element("css selector", "body").get_attribute("data-ready") == "true",
         what="the page started")
    assert not by_id(driver, "key-dialog").is_displayed()


def new_chat(driver, *, max_tokens: int, schema: str = "", temperature: str = "0") -> None:
    by_id(driver, "new-chat").click()
    fill(driver, "temperature", temperature)
    fill(driver, "max-tokens", str(max_tokens))
    fill(driver, "json-schema", schema)


def ask(driver, question: str) -> None:
    box = by_id(driver, "prompt")
    box.send_keys(question)
    by_id(driver, "send").click()


def finished(driver) -> bool:
    return by_id(driver, "send").is_displayed() and not by_id(driver, "stop").is_displayed()
