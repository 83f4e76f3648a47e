"""The page's catalog panel in headless Chromium (docs/models.md, "Models at run time"):
each catalog model's state, read from ``GET /models``, and an admin's load and unload
through its buttons, against a real ``zeroserve serve --models-dir`` process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import ServerProcess, scaled, start_server, wait_until
from tests.ui.conftest import save_screenshot
from tests.ui.test_browser import WAIT_S, open_page


@pytest.fixture
def catalog_server(tmp_path: Path) -> Iterator[ServerProcess]:
    twin = tmp_path / "models" / "twin"
    twin.mkdir(parents=True)
    (twin / "model.toml").write_text('spec = "echo"\n')
    server = start_server("--models-dir", str(tmp_path / "models"), "--model", "echo")
    yield server
    assert server.stop() == 0


def _row(browser: Any, name: str) -> Any:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.CSS_SELECTOR, f'#catalog-table tr[data-model="{name}"]')


def _state(browser: Any, name: str) -> str:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return str(_row(browser, name).find_element(By.CSS_SELECTOR, ".state").text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def _click(browser: Any, name: str, action: str) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def clicked() -> bool:
        try:
            button = _row(browser, name).find_element(By.CSS_SELECTOR, f"button.{action}")
            if not button.is_enabled():
                return False
            button.click()
            return True
        except StaleElementReferenceException:  # the panel was redrawn: find it again
            return False

    wait_until(clicked, WAIT_S, f"the {action} button of {name}")


def test_the_catalog_panel_shows_states_and_loads_and_unloads(
    browser: Any, catalog_server: ServerProcess, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, catalog_server.url)
    wait_until(lambda: _state(browser, "twin") == "unloaded", WAIT_S, "twin shown unloaded")
    assert _state(browser, "echo") == "loaded"
    assert "(pinned)" in _row(browser, "echo").text

    _click(browser, "twin", "load")
    wait_until(lambda: _state(browser, "twin") == "loaded", scaled(WAIT_S), "twin loaded")
    states = {
        m["id"]: m["status"] for m in httpx.get(catalog_server.url + "/models").json()["data"]
    }
    assert states["twin"] == {"value": "loaded"}
    save_screenshot(browser.find_element(By.ID, "catalog"), tmp_path, "catalog-panel.png")

    _click(browser, "twin", "unload")
    wait_until(lambda: _state(browser, "twin") == "unloaded", scaled(WAIT_S), "twin unloaded")
    assert browser.find_element(By.ID, "catalog-note").text == "twin: unloaded"
