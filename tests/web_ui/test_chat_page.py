"""MILI's chat page as a person uses it: headless chromium against the real server (gateway and worker
processes) on the default model, with an API key, one server and one browser for the module.

The tests run in order: the first gives the page its key, the others use the page with it."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import httpx2
import pytest

from tests.helpers.server import ROOT, Server
from tests.web_ui.browser import (answers, ask, by_id, console_errors, fill, finished, last_answer, local_storage,
                                  new_chat, open_page, start_chromium, text_of, wait)

KEY = "sk-web-ui-test"
# Screenshots land in build/screenshots/; MILI_UPDATE_SCREENSHOTS=1 writes them over the README's copies in docs/
# (a test run never edits tracked files unasked).
SCREENSHOTS = ROOT / ("docs" if os.environ.get("MILI_UPDATE_SCREENSHOTS") == "1" else "build/screenshots")
LONG_SCHEMA = '{"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 3000}'
REFUSED = ("401",)  # the console's line for each call the server refused


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server("default", "--dtype", "auto", log_path=tmp_path_factory.mktemp("web_ui") / "server.log",
                 env={"MILI_API_KEY": KEY}).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = start_chromium(tmp_path_factory.mktemp("chromium"))
    yield driver
    driver.quit()


def test_the_key_server_serves_the_page_but_refuses_its_calls_until_the_key_is_given(server, browser):
    # Without a key: the page and its assets load, the API (the metrics too) does not, /health does.
    for path in ("/", "/web-ui/app.js", "/web-ui/style.css", "/health"):
        assert httpx2.get(server.url + path, timeout=10).status_code == 200, path
    for path in ("/v1/models", "/metrics"):
        assert httpx2.get(server.url + path, timeout=10).status_code == 401, path
    refused_before = server.metric("mili_http_unauthorized_total")

    browser.get(server.url + "/")
    browser.execute_script("localStorage.clear()")
    browser.refresh()
    dialog = wait(browser, lambda d: by_id(d, "key-dialog") if by_id(d, "key-dialog").is_displayed() else None,
                  what="the key dialog")
    assert "needs an API key" in text_of(browser, "key-reason")
    assert text_of(browser, "srv-running") == "–"  # the metrics were refused
    assert text_of(browser, "model-name") == "…"
    assert server.metric("mili_http_unauthorized_total") > refused_before

    by_id(browser, "key-input").send_keys("sk-wrong")
    by_id(browser, "key-submit").click()
    wait(browser, lambda d: "refused" in text_of(d, "key-reason"), what="the wrong key refused")
    assert dialog.is_displayed() and "invalid or missing API key" in text_of(browser, "key-error")

    by_id(browser, "key-input").clear()
    by_id(browser, "key-input").send_keys(KEY)
    by_id(browser, "key-submit").click()
    wait(browser, lambda d: not by_id(d, "key-dialog").is_displayed(), what="the dialog closed")
    assert text_of(browser, "model-name").startswith("SmolLM2-135M-Instruct")
    wait(browser, lambda d: text_of(d, "srv-running") == "0" and text_of(d, "srv-device") == "cpu",
         what="the server panel filled")
    assert text_of(browser, "srv-backend") in ("mojo", "torch")
    assert text_of(browser, "srv-quant") == "q4_1"  # the default model's GGUF blocks
    assert re.fullmatch(r"\d+\.\d% of \d+ blocks", text_of(browser, "srv-kv"))
    assert browser.execute_script("return localStorage.getItem('mili.apiKey')") == KEY
    assert not console_errors(browser, allowed=REFUSED)


def test_a_question_streams_an_answer_with_its_numbers(server, browser):
    open_page(browser, server)
    new_chat(browser, max_tokens=80)
    prompt_before = server.metric("mili_prompt_tokens_total")
    generated_before = server.metric("mili_generation_tokens_total")
    ask(browser, "Write a Python function that reverses a string. Answer with a code block.")

    # The answer grows while it streams: several different partial texts before the end.
    seen = set()
    deadline = time.monotonic() + 120
    while not finished(browser) and time.monotonic() < deadline:
        text = last_answer(browser)
        if text:
            seen.add(text)
        time.sleep(0.1)
    assert finished(browser), "the answer did not end"
    assert len(seen) >= 2, seen

    content = last_answer(browser)
    assert content and min(map(len, seen)) < len(content)  # it came in pieces, the first ones shorter
    stats = last_answer(browser, ".stats")
    match = re.fullmatch(r"TTFT (\d+) ms · ([\d.]+) tokens/s · (\d+) tokens in · (\d+) out(?: · \d+ cached)? · (\w+)",
                         stats)
    assert match, stats
    tokens_in, tokens_out = int(match[3]), int(match[4])
    # The page's numbers are the stream's usage, which is what the server counted.
    assert tokens_in == server.metric("mili_prompt_tokens_total") - prompt_before
    assert tokens_out == server.metric("mili_generation_tokens_total") - generated_before
    assert 0 < tokens_out <= 80 and match[5] in ("stop", "length")

    # Kept in local storage: a reload shows the conversation again.
    saved = local_storage(browser, "mili.conversations")
    assert saved[0]["messages"][0]["content"].startswith("Write a Python function")
    wait(browser, lambda d: text_of(d, "srv-running") == "0", timeout=10, what="the panel shows none running")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOTS / "web_ui_chat.png"))
    open_page(browser, server)
    assert "reverses a string" in by_id(browser, "conversation-list").text
    assert last_answer(browser) == content
    # Everything the page loaded came from this server (it works offline: no CDN, no web fonts).
    loaded = browser.execute_script("return performance.getEntriesByType('resource').map((e) => e.name)")
    assert loaded and all(url.startswith(server.url + "/") for url in loaded), loaded
    assert not console_errors(browser)


def test_stop_ends_a_long_answer_and_frees_its_request(server, browser):
    open_page(browser, server)
    # An answer that cannot end early: the page's JSON-schema setting asks for thousands of digits, so the model
    # has no end-of-text to choose for many seconds (a plain prompt may end at once on a fast machine).
    new_chat(browser, max_tokens=4000, schema=LONG_SCHEMA)
    aborted_before = server.metric("mili_requests_total", finish_reason="abort")
    ask(browser, "Count from 1 to 1000.")
    wait(browser, lambda d: server.metric("mili_requests_running") >= 1 and last_answer(d),
         timeout=120, what="the answer started")
    # The server panel sees the request running.
    wait(browser, lambda d: text_of(d, "srv-running") == "1", timeout=10, what="the panel shows it running")
    # A little way in (the request still running: the page has not seen its end), for the picture.
    wait(browser, lambda d: len(last_answer(d)) >= 60 or finished(d), timeout=60, what="some of the answer")
    assert not finished(browser) and server.metric("mili_requests_running") >= 1
    browser.save_screenshot(str(SCREENSHOTS / "web_ui_panel.png"))

    by_id(browser, "stop").click()
    wait(browser, lambda d: finished(d), timeout=10, what="the page stopped")
    wait(browser, lambda d: server.metric("mili_requests_running") == 0, timeout=30, what="the request freed")
    assert server.metric("mili_requests_total", finish_reason="abort") == aborted_before + 1
    assert last_answer(browser, ".stats").endswith("stopped")
    wait(browser, lambda d: text_of(d, "srv-running") == "0", timeout=10, what="the panel shows none running")
    frozen = last_answer(browser)
    time.sleep(1.0)
    assert last_answer(browser) == frozen
    assert not console_errors(browser)


def test_a_refused_question_asks_for_the_key_and_is_answered_once_it_is_given(server, browser):
    open_page(browser, server)
    new_chat(browser, max_tokens=8)
    refused_before = server.metric("mili_http_unauthorized_total", route="/v1/chat/completions")
    # The key changes just as the question is sent (one script: the panel's next poll cannot come between).
    browser.execute_script("localStorage.setItem('mili.apiKey', 'sk-revoked');"
                           "document.getElementById('prompt').value = 'Say hello.';"
                           "document.getElementById('send').click();")
    wait(browser, lambda d: by_id(d, "key-dialog").is_displayed(), timeout=30, what="the key dialog")
    assert "refused" in text_of(browser, "key-reason") and not answers(browser)
    assert server.metric("mili_http_unauthorized_total", route="/v1/chat/completions") == refused_before + 1
    by_id(browser, "key-input").send_keys(KEY)
    by_id(browser, "key-submit").click()
    wait(browser, lambda d: not by_id(d, "key-dialog").is_displayed() and answers(d) and finished(d), timeout=120,
         what="the question answered with the key")
    assert last_answer(browser, ".stats").startswith("TTFT")
    assert not console_errors(browser, allowed=REFUSED)


# The model is made to write markup through the page's own JSON-schema setting: each string a `const`, so the
# grammar forces the server's output to hold it exactly.
MARKUP = {
    "img": "<img src=x onerror='window.__pwned=1'>",
    "script": "<script>window.__pwned=2</script>",
    "link": "[click me](javascript:window.__pwned=3)",
    "svg": "<svg onload='window.__pwned=4'></svg>",
}
MARKUP_SCHEMA = ('{"type": "object", "properties": {'
                 + ", ".join(f'"{k}": {{"const": "{v}"}}' for k, v in MARKUP.items())
                 + '}, "required": [' + ", ".join(f'"{k}"' for k in MARKUP) + '], "additionalProperties": false}')


def test_markup_in_the_models_output_runs_nothing(server, browser):
    open_page(browser, server)
    new_chat(browser, max_tokens=200, schema=MARKUP_SCHEMA)
    ask(browser, "Answer in JSON.")
    wait(browser, finished, timeout=120, what="the answer ended")
    answer = answers(browser)[-1]
    content = answer.find_element("css selector", ".content")
    for text in MARKUP.values():
        assert text in content.text, (text, content.text)
    assert not content.find_elements("css selector", "img, script, svg, iframe, object")
    assert all(not (a.get_attribute("href") or "").startswith("javascript")
               for a in content.find_elements("css selector", "a"))
    time.sleep(0.5)  # an image's error event would have fired by now
    assert browser.execute_script("return window.__pwned") is None
    by_id(browser, "json-schema").clear()
    fill(browser, "json-schema", "")
    assert not console_errors(browser)


def test_edit_resend_and_regenerate(server, browser):
    open_page(browser, server)
    new_chat(browser, max_tokens=8, temperature="1.0")
    ask(browser, "Name a colour.")
    wait(browser, finished, timeout=120, what="the first answer")

    from selenium.webdriver.common.by import By

    browser.find_element(By.CSS_SELECTOR, "#messages .message.user .edit").click()
    editor = browser.find_element(By.CSS_SELECTOR, "#messages .edit-box")
    editor.clear()
    editor.send_keys("Name a fruit.")
    browser.find_element(By.CSS_SELECTOR, "#messages .editing .save").click()
    wait(browser, finished, timeout=120, what="the edited question's answer")
    users = browser.find_elements(By.CSS_SELECTOR, "#messages .message.user")
    assert [u.find_element(By.CSS_SELECTOR, ".content").text for u in users] == ["Name a fruit."]
    assert len(answers(browser)) == 1

    prompt_before = server.metric("mili_requests_total")
    answers(browser)[-1].find_element(By.CSS_SELECTOR, ".regenerate").click()
    wait(browser, lambda d: finished(d) and server.metric("mili_requests_total") == prompt_before + 1,
         timeout=120, what="the regenerated answer")
    assert len(answers(browser)) == 1  # replaced, not added
    saved = local_storage(browser, "mili.conversations")[0]["messages"]
    assert [m["role"] for m in saved] == ["user", "assistant"] and saved[0]["content"] == "Name a fruit."
    assert not console_errors(browser)


WEATHER_TOOL = ('[{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", '
                '"parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, '
                '"required": ["city"]}}}]')


def test_a_tool_call_shows_when_the_request_carries_tools(server, browser):
    from selenium.webdriver.support.ui import Select

    open_page(browser, server)
    new_chat(browser, max_tokens=100)
    fill(browser, "tools", WEATHER_TOOL)
    Select(by_id(browser, "tool-choice")).select_by_value("required")  # the grammar makes the model call it
    browser.execute_script("arguments[0].dispatchEvent(new Event('change'))", by_id(browser, "tool-choice"))
    ask(browser, "What is the weather in Paris?")
    wait(browser, finished, timeout=120, what="the tool call")
    assert last_answer(browser, ".tool-call .tool-name") == "Tool call: get_weather"
    arguments = json.loads(last_answer(browser, ".tool-call pre"))
    assert set(arguments) == {"city"} and isinstance(arguments["city"], str)
    assert last_answer(browser, ".stats").endswith("tool_calls")
    fill(browser, "tools", "")
    assert not console_errors(browser)


# The renderer on its own, in the page's browser: (Markdown, the HTML it must build). Every < and > of the input
# comes out as text (&lt; &gt;); only http(s) and mailto links become links.
RENDERED = [
    ("**bold [link](https://example.com/a?b=1) `code`** and *it*",
     '<p><strong>bold <a href="https://example.com/a?b=1" rel="noopener noreferrer nofollow" target="_blank">link</a>'
     ' <code>code</code></strong> and <em>it</em></p>'),
    ("[x](javascript:alert(1)) [y](data:text/html,hi) <b onclick=x>b</b>",
     "<p>[x](javascript:alert(1)) [y](data:text/html,hi) &lt;b onclick=x&gt;b&lt;/b&gt;</p>"),
    ("a snake_case_name b my__var__x __c__", "<p>a snake_case_name b my__var__x <strong>c</strong></p>"),
    ("```html\n<script>alert(1)</script>\n```",
     '<div class="code-block"><div class="code-bar"><span>html</span><button class="copy" type="button">Copy</button>'
     "</div><pre><code>&lt;script&gt;alert(1)&lt;/script&gt;</code></pre></div>"),
    ("```py\nunclosed = 1", '<div class="code-block"><div class="code-bar"><span>py</span><button class="copy" '
     'type="button">Copy</button></div><pre><code>unclosed = 1</code></pre></div>'),
    ("# Title\n- one\n- **two**\n\n1. first\n2. second\n> quoted <i>\n\n---",
     "<h3>Title</h3><ul><li>one</li><li><strong>two</strong></li></ul><ol start=\"1\"><li>first</li><li>second</li>"
     "</ol><blockquote><p>quoted &lt;i&gt;</p></blockquote><hr>"),
    ("| a | b |\n|---|:-:|\n| <img> | 2 |",
     '<div class="table-wrap"><table><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><td>&lt;img&gt;</td>'
     "<td>2</td></tr></tbody></table></div>"),
    ("line one\nline two", "<p>line one<br>line two</p>"),
]


def test_the_markdown_renderer_builds_only_safe_nodes(server, browser):
    open_page(browser, server)
    html = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "import('/web-ui/markdown.js').then((md) => done(arguments[0].map((text) => {"
        "  const box = document.createElement('div'); box.append(md.renderMarkdown(text)); return box.innerHTML;"
        "})), (e) => done(String(e)));", [markdown for markdown, _ in RENDERED])
    assert html == [expected for _, expected in RENDERED]


def test_reasoning_shows_apart_from_the_answer_and_folded(server, browser):
    """A Qwen3 answer's reasoning, as reasoning_content or as a leading <think> block, in a folded <details>."""
    open_page(browser, server)
    views = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "import('/web-ui/chat_view.js').then((v) => done([arguments[0], arguments[1]].map((m) => {"
        "  const node = v.messageView(m, 1, {isLast: true, busy: false, handlers: {}});"
        "  const d = node.querySelector('details.reasoning');"
        "  return [d && d.open, d && d.querySelector('.reasoning-text').textContent,"
        "          node.querySelector('.content').textContent];"
        "})), (e) => done(String(e)));",
        {"role": "assistant", "content": "The answer.", "reasoning": "Let me think <b>."},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nThe answer."})
    assert views == [[False, "Let me think <b>.", "The answer."], [False, "hmm", "The answer."]]
