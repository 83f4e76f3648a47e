"""The page at / with a real LLM: the built-in ``smollm2`` (llama.cpp, in-process)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import ServerProcess, start_server, wait_until
from tests.ui.test_browser import chat, finished, open_page, set_value

# Waits on smollm2's decode, below the loop: bounds by model_slowdown (tests/conftest.py).
pytestmark = pytest.mark.niced

# SmolLM2-135M on two busy cores makes a few tokens a second: a short answer is enough.
MAX_TOKENS = 32
HELPFUL = "You are a helpful assistant."
# A whole answer of MAX_TOKENS on a loaded 2-core box (prompt and decode).
ANSWER_S = 90.0


@pytest.fixture(scope="module")
def llm_server() -> Iterator[ServerProcess]:
    server = start_server("--model", "smollm2", "--model", "echo")
    yield server
    assert server.stop() == 0


def test_smollm2_answers_in_the_page(browser: Any, llm_server: ServerProcess) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, llm_server.url)
    # the page picks the real chat model by default
    assert browser.find_element(By.ID, "model").get_attribute("value") == "smollm2"
    set_value(browser, "temperature", "0")
    set_value(browser, "system", HELPFUL)
    answer = chat(browser, "smollm2", "What is the capital of France?", MAX_TOKENS)
    finished(answer, timeout=ANSWER_S, model=True)
    assert "Paris" in answer.find_element(By.CSS_SELECTOR, ".content").text
    meta = answer.find_element(By.CSS_SELECTOR, ".meta").text
    assert "TTFT" in meta and "completion tokens" in meta


def test_smollm2_json_schema_mode(browser: Any, llm_server: ServerProcess) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, llm_server.url)
    set_value(browser, "temperature", "0")
    set_value(browser, "system", HELPFUL)
    answer = chat(browser, "smollm2", "What is the capital of France?", MAX_TOKENS, json_mode=True)
    finished(answer, timeout=ANSWER_S, model=True)
    # the default schema asks for {"answer": string}; the grammar makes the model keep it
    shown = json.loads(answer.find_element(By.CSS_SELECTOR, "pre.json").text)
    assert set(shown) == {"answer"} and "Paris" in shown["answer"]


def test_stop_frees_the_engine_slot(browser: Any, llm_server: ServerProcess) -> None:
    from selenium.webdriver.common.by import By

    from tests.ui.test_browser import WAIT_S, gauge

    open_page(browser, llm_server.url)
    answer = chat(browser, "smollm2", "Write a long story about a dragon.", 500)
    content = answer.find_element(By.CSS_SELECTOR, ".content")
    wait_until(lambda: len(content.text) > 20, ANSWER_S, "tokens to stream in", model=True)
    assert gauge(llm_server.url, "zeroserve_engine_active", "smollm2") == 1
    browser.find_element(By.ID, "stop").click()
    finished(answer, "stopped")
    wait_until(
        lambda: gauge(llm_server.url, "zeroserve_engine_active", "smollm2") == 0,
        WAIT_S,
        "the slot to be freed",
        model=True,
    )
    wait_until(
        lambda: gauge(llm_server.url, "zeroserve_queue_in_flight", "smollm2") == 0,
        WAIT_S,
        "in-flight 0",
    )
