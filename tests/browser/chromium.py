"""A headless chromium that the tests drive from the worker's own event loop."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCREENSHOTS_ENV = "TUNELOOP_SCREENSHOTS_DIR"
"""Set to a folder (docs/images) to copy each screenshot there as well."""


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
