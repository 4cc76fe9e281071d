"""Browser tests: Debian's chromium, driven by selenium, against a worker's dashboard.

`make test` installs `chromium` and `chromium-driver` when `chromium` is missing (see the
Makefile). Selenium is given `/usr/bin/chromedriver` explicitly, so it never tries to
download a driver (Selenium Manager stays unused: these tests run offline).

Screenshots go to each test's own folder (`tmp_path`). To refresh the ones the docs show,
run the tests with `TUNELOOP_SCREENSHOTS_DIR` set:

    TUNELOOP_SCREENSHOTS_DIR=docs/images .venv/bin/python -m pytest -m browser tests/browser

Fixtures:
    browser   (session) one headless chromium, wrapped so that the event loop never blocks on it
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser.chromium import Browser

CHROMEDRIVER = Path("/usr/bin/chromedriver")
WINDOW = (1280, 860)


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    if shutil.which("chromium") is None or not CHROMEDRIVER.exists():
        message = "chromium and chromium-driver are not installed (make test installs them)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for flag in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root, where chromium's sandbox refuses to start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield Browser(driver)
    finally:
        driver.quit()
