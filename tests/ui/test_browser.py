"""The page at / in headless Chromium: chat streaming, stop, output as text, the live
dashboard under load, and screenshots of both panes."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests.support import ServerProcess, scaled, start_server, wait_until
from tests.ui.conftest import save_screenshot
from tests.ui.stats import counter
from zeroserve.app.limits import MAX_OUTPUT_TOKENS
from zeroserve.models.echo import EchoModel

T = TypeVar("T")

# How long the page may take to show what a test waits for (polled, never slept).
WAIT_S = 30.0
# The bounded load of the dashboard test: at most this many requests, for at most this
# long, 64 KiB raw bodies (W1's smallest size).
LOAD_REQUESTS = 2000
LOAD_S = scaled(30.0)
LOAD_BODY = b"z" * (64 * 1024)
STREAMS = 40
# The seed's claim, as the dashboard shows it: copies are at most 2 % of payload bytes.
MAX_COPY_RATIO = 0.02


def gauge(url: str, name: str, label: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    m = re.search(rf'^{name}\{{name="{label}"\}} (\S+)$', text, re.M)
    assert m, f"{name} missing"
    return float(m.group(1))


def open_page(driver: Any, url: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(url + "/")
    wait_until(
        lambda: driver.find_elements(By.CSS_SELECTOR, "#model option"), WAIT_S, "the model list"
    )
    wait_until(
        lambda: driver.find_element(By.ID, "dash-pane").get_attribute("data-updates"),
        WAIT_S,
        "a dashboard update",
    )


def chat(driver: Any, model: str, prompt: str, max_tokens: int, *, json_mode: bool = False) -> Any:
    """Pick ``model``, type ``prompt`` and send it; return the answer's element."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.ID, "model")).select_by_value(model)
    set_value(driver, "max-tokens", str(max_tokens))
    box = driver.find_element(By.ID, "json-mode")
    if box.is_selected() != json_mode:
        box.click()
    before = len(driver.find_elements(By.CSS_SELECTOR, ".msg.assistant"))
    area = driver.find_element(By.ID, "prompt")
    area.clear()
    # set the text by script: send_keys would type "<" and quotes through keyboard layouts
    driver.execute_script("arguments[0].value = arguments[1];", area, prompt)
    driver.find_element(By.ID, "send").click()
    answers = wait_until(
        lambda: (
            (a := driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")) and len(a) > before and a
        ),
        WAIT_S,
        "the answer box",
    )
    return answers[-1]


def echoed(prompt: str, max_tokens: int) -> list[str]:
    """The words echo answers a one-message chat with: its chat-templated prompt, cycled."""
    words = EchoModel().chat_template([{"role": "user", "content": prompt}]).split()
    return (words * (max_tokens // len(words) + 1))[:max_tokens]


def finished(
    answer: Any, state: str = "done", timeout: float = WAIT_S, *, model: bool = False
) -> Any:
    return wait_until(
        lambda: answer.get_attribute("data-state") == state,
        timeout,
        f"the answer to be {state}",
        model=model,
    )


def set_value(driver: Any, element_id: str, value: str) -> None:
    from selenium.webdriver.common.by import By

    field = driver.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(value)


def test_chat_streams_an_answer(browser: Any, ui_server: ServerProcess, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, ui_server.url)
    options = {
        o.get_attribute("value"): o for o in browser.find_elements(By.CSS_SELECTOR, "#model option")
    }
    assert set(options) == {"echo", "minilm"}
    # an embedding model cannot chat: the picker says so once /v1/stats was read
    wait_until(lambda: options["minilm"].get_attribute("disabled"), WAIT_S, "minilm to be marked")
    answer = chat(browser, "echo", "What is the capital of France?", 12)
    finished(answer)
    content = answer.find_element(By.CSS_SELECTOR, ".content").text
    assert content.split() == echoed("What is the capital of France?", 12)
    meta = answer.find_element(By.CSS_SELECTOR, ".meta").text
    assert "TTFT" in meta and "tok/s" in meta
    assert re.search(r"\b\d+ prompt \+ 12 completion tokens\b", meta), meta
    assert "finish: length" in meta
    save_screenshot(browser.find_element(By.ID, "chat-pane"), tmp_path, "chat-pane.png")


def test_json_schema_mode_shows_the_servers_refusal(browser: Any, ui_server: ServerProcess) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, ui_server.url)
    # echo cannot honour a schema: the server refuses with a 400 naming the parameter,
    # and the page shows that answer (smollm2's grammar path: test_browser_smollm2.py)
    answer = chat(browser, "echo", "What is the capital of France?", 4, json_mode=True)
    finished(answer, "error")
    error = answer.find_element(By.CSS_SELECTOR, ".error").text
    assert error.startswith("HTTP 400: ") and "(param: response_format)" in error
    assert not answer.find_elements(By.CSS_SELECTOR, "pre.json")
    assert not answer.find_element(By.CSS_SELECTOR, ".content").text


def test_stop_cancels_on_the_server(browser: Any, ui_server: ServerProcess) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, ui_server.url)
    # the longest answer a request may ask for (app/limits.py): far longer than the test
    answer = chat(browser, "echo", "tick tock", MAX_OUTPUT_TOKENS)
    content = answer.find_element(By.CSS_SELECTOR, ".content")
    # tokens show while the answer is still streaming
    wait_until(
        lambda: answer.get_attribute("data-state") == "streaming" and len(content.text) > 200,
        WAIT_S,
        "tokens to stream in",
    )
    assert gauge(ui_server.url, "zeroserve_queue_in_flight", "echo") == 1
    browser.find_element(By.ID, "stop").click()
    finished(answer, "stopped")
    wait_until(
        lambda: gauge(ui_server.url, "zeroserve_queue_in_flight", "echo") == 0,
        WAIT_S,
        "the server to cancel",
    )
    wait_until(
        lambda: gauge(ui_server.url, "zeroserve_workers_streams", "echo") == 0,
        WAIT_S,
        "the stream's channel to close",
    )
    # and the dashboard shows it
    wait_until(
        lambda: browser.find_element(By.ID, "s-inflight").get_attribute("data-value") == "0",
        WAIT_S,
        "the dashboard's in-flight to be 0",
    )
    assert browser.find_element(By.ID, "send").is_enabled()


def test_model_output_is_text_not_html(browser: Any, ui_server: ServerProcess) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    open_page(browser, ui_server.url)
    payload = (
        '<script>window.__pwned=1</script> <img src=x onerror="window.__pwned=2;alert(1)"> '
        '<b>bold</b> <svg/onload="window.__pwned=3">'
    )
    answer = chat(browser, "echo", payload, len(echoed(payload, 1000)))
    finished(answer)
    assert payload in answer.find_element(By.CSS_SELECTOR, ".content").text
    assert browser.execute_script("return window.__pwned") is None
    for tag in ("img", "script", "b", "svg"):
        assert not browser.find_elements(By.CSS_SELECTOR, f"#messages {tag}"), tag
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018


def test_dashboard_moves_under_load(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    # A fresh server, so "since start" covers only this page and this load.
    server = start_server("--model", "echo")
    stop = threading.Event()
    sent = [0]

    def raw_load() -> None:
        deadline = time.monotonic() + LOAD_S
        with httpx.Client(base_url=server.url) as client:
            while sent[0] < LOAD_REQUESTS and not stop.is_set() and time.monotonic() < deadline:
                r = client.post("/v1/raw/echo", content=LOAD_BODY)
                assert r.status_code == 200 and len(r.content) == len(LOAD_BODY)
                sent[0] += 1

    def value(id_: str, attr: str = "data-value") -> float | None:
        text = browser.find_element(By.ID, id_).get_attribute(attr)
        return float(text) if text else None

    try:
        open_page(browser, server.url)
        loader = threading.Thread(target=raw_load, daemon=True)
        loader.start()
        # raw echo: requests/s climbs, and copies stay a sliver of the payload bytes
        wait_until(lambda: (value("s-rps") or 0) > 1, WAIT_S, "requests/s to move")
        ratios = wait_until(
            lambda: (
                (w := value("s-copy", "data-window")) is not None
                and (value("s-rps") or 0) > 1
                and (w, value("s-copy", "data-total"))
            ),
            WAIT_S,
            "a copy ratio over a window with load",
        )
        assert ratios[0] <= MAX_COPY_RATIO and ratios[1] is not None and ratios[1] <= MAX_COPY_RATIO
        stop.set()
        loader.join(LOAD_S)
        assert sent[0] > 0
        # the server's own counters agree: copies are under 2 % of payload bytes
        doc = httpx.get(f"{server.url}/v1/stats").json()
        payload = counter(doc, "zeroserve_payload_bytes")
        assert payload >= sent[0] * len(LOAD_BODY)
        assert counter(doc, "zeroserve_copied_bytes") <= MAX_COPY_RATIO * payload

        # streams: tokens/s and TTFT show up
        def streams() -> None:
            with httpx.Client(base_url=server.url, timeout=LOAD_S) as client:
                for _ in range(STREAMS):
                    if stop.is_set():
                        return
                    with client.stream(
                        "POST",
                        "/v1/chat/completions",
                        json={
                            "model": "echo",
                            "stream": True,
                            "max_tokens": 2000,
                            "messages": [{"role": "user", "content": "a stream of words"}],
                        },
                    ) as r:
                        assert r.status_code == 200
                        for _ in r.iter_bytes():
                            pass

        stop.clear()
        streamer = threading.Thread(target=streams, daemon=True)
        streamer.start()
        wait_until(lambda: (value("s-tps") or 0) > 1, WAIT_S, "tokens/s to move")
        wait_until(
            lambda: "/" in browser.find_element(By.ID, "s-ttft").text, WAIT_S, "TTFT to show"
        )
        streamer.join(LOAD_S)
        stop.set()
        rows = browser.find_elements(By.CSS_SELECTOR, "#model-table tbody tr")
        assert [r.get_attribute("data-model") for r in rows] == ["echo"]
        finished(chat(browser, "echo", "Hello from the playground", 12))
        save_screenshot(browser.find_element(By.ID, "dash-pane"), tmp_path, "dashboard-pane.png")
        save_screenshot(browser.find_element(By.TAG_NAME, "main"), tmp_path, "page.png")
    finally:
        stop.set()
        assert server.stop() == 0


def test_the_page_asks_for_an_api_key_and_sends_it(browser: Any) -> None:
    from selenium.webdriver.common.by import By

    from tests.ui.test_page import API_KEY

    server = start_server("--model", "echo", env={"ZEROSERVE_API_KEY": API_KEY})
    try:
        browser.get(server.url + "/")
        browser.execute_script("sessionStorage.clear()")  # no key from an earlier test
        browser.get(server.url + "/")
        form = browser.find_element(By.ID, "key-form")
        wait_until(form.is_displayed, WAIT_S, "the key form")
        assert not browser.find_elements(By.CSS_SELECTOR, "#model option")
        assert browser.find_element(By.ID, "server-state").text == "API key needed"
        set_value(browser, "api-key", API_KEY)
        browser.find_element(By.ID, "key-save").click()
        wait_until(
            lambda: browser.find_elements(By.CSS_SELECTOR, "#model option"),
            WAIT_S,
            "the model list",
        )
        wait_until(lambda: not form.is_displayed(), WAIT_S, "the key form to go")
        wait_until(
            lambda: browser.find_element(By.ID, "dash-pane").get_attribute("data-updates"),
            WAIT_S,
            "a dashboard update",
        )
        answer = chat(browser, "echo", "keyed hello", 3)
        finished(answer)
        assert answer.find_element(By.CSS_SELECTOR, ".content").text.split() == echoed(
            "keyed hello", 3
        )
    finally:
        browser.execute_script("sessionStorage.clear()")
        assert server.stop() == 0
