"""The installed faust-streaming is the release whose fetch loop the intake's consumer copies."""

from __future__ import annotations

import inspect
import re
import tomllib
from importlib.metadata import version
from pathlib import Path

from faust.tables import TableManager

from handlers.faust_app import PromptTableManager, new_app
from handlers.seek_safe_consumer import FAUST_RELEASE
from orchestrator.settings import KafkaSettings

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_installed_faust_is_the_release_the_seek_safe_consumer_copies() -> None:
    installed = version("faust-streaming")
    assert installed == "0.15.3", (
        f"faust-streaming {installed} is installed, but handlers/seek_safe_consumer.py "
        "replaces the fetch loop of faust-streaming 0.15.3: a record read around a seek may "
        "be skipped again. Read faust's changes to faust/transport/consumer.py, mend the copy, "
        "then change FAUST_RELEASE, pyproject.toml and this test together."
    )


def test_the_seek_safe_consumer_names_the_release_it_copies() -> None:
    assert FAUST_RELEASE == "0.15.3"


def test_pyproject_pins_faust_to_exactly_that_release() -> None:
    dependencies = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["dependencies"]
    (faust,) = [d for d in dependencies if re.match(r"faust-streaming\b", d)]
    assert faust == "faust-streaming==0.15.3"


def test_faust_s_table_manager_still_starts_as_the_prompt_one_copies_it() -> None:
    """`PromptTableManager.on_start` is faust's own without its one-second sleep: another
    release may start its tables differently, and the copy must then be read again."""
    body = [line.strip() for line in inspect.getsource(TableManager.on_start).splitlines()[2:]]
    assert [line for line in body if line] == [
        "await self.sleep(1.0)",
        "if not self.should_stop:",
        "await self._update_channels()",
        "await self.recovery.start()",
    ]
    assert new_app(KafkaSettings(group_id="release-test")).conf.TableManager is PromptTableManager
