"""Fixtures of the browser suite: a real ``zeroserve serve`` process and headless
Chromium driven by selenium (Debian's ``chromium`` and ``chromium-driver``).

The suite skips, saying why, only when no Chromium or chromedriver is installed (``make
test`` installs them with apt-get when it can) or selenium is missing. Screenshots go to
the test's tmp dir, and also to ``$ZEROSERVE_TEST_SCREENSHOTS`` when that is set.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import ServerProcess, start_server

# The window the page is laid out in (both panes side by side).
WINDOW = (1400, 1000)
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _chromium() -> tuple[str, str] | None:
    browser = next((p for p in map(shutil.which, BROWSERS) if p), None)
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="module")
def ui_server() -> Iterator[ServerProcess]:
    server = start_server("--model", "echo", "--model", "minilm")
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is not installed (pip install -e '.[ui]')"
    )
    from selenium.webdriver.chrome.service import Service

    found = _chromium()
    if found is None:
        pytest.skip(
            "no Chromium: the browser tests need Debian's chromium and chromium-driver "
            "(make test runs apt-get install for them when it can)"
        )
    binary, driver_path = found
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "--disable-extensions",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def save_screenshot(element: Any, folder: Path, name: str) -> Path:
    """Save ``element``'s screenshot as ``folder/name`` (and under the env folder)."""
    path = folder / name
    element.screenshot(str(path))
    extra = os.environ.get("ZEROSERVE_TEST_SCREENSHOTS")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, Path(extra) / name)
    return path
