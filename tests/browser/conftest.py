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

import asyncio
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOTS_ENV = "TUNELOOP_SCREENSHOTS_DIR"
WINDOW = (1280, 860)


class Browser:
    """A headless chromium whose every call runs in a thread.

    The worker under test serves the dashboard from the test's own event loop; a selenium
    call made on that loop would block it while the browser waits for the page: a deadlock.
    """

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    async def open(self, url: str) -> None:
        await asyncio.to_thread(self.driver.get, url)

    async def text(self) -> str:
        return str(
            await asyncio.to_thread(lambda: self.driver.find_element("tag name", "body").text)
        )

    async def run(self, script: str) -> Any:
        return await asyncio.to_thread(self.driver.execute_script, script)

    async def wait_for_text(self, *texts: str, timeout: float = 60) -> str:
        """The page's text, once it shows every one of *texts* (without reloading it)."""
        return await self.wait_until(
            lambda body: all(text in body for text in texts), timeout=timeout, what=texts
        )

    async def wait_until(
        self, holds: Callable[[str], bool], *, timeout: float, what: object
    ) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        body = ""
        while loop.time() < deadline:
            body = await self.text()
            if holds(body):
                return body
            await asyncio.sleep(0.25)
        raise AssertionError(f"the page never showed {what!r}; it shows:\n{body}")

    async def screenshot(self, folder: Path, name: str) -> Path:
        """Save the window as *folder*/*name*.png, and into the docs when asked to."""
        path = folder / f"{name}.png"
        await asyncio.to_thread(self.driver.save_screenshot, str(path))
        target = os.environ.get(SCREENSHOTS_ENV)
        if target:
            Path(target).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, Path(target) / path.name)
        return path


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
