"""The installed faust-streaming is the release whose fetch loop the intake's consumer copies."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

from handlers.seek_safe_consumer import FAUST_RELEASE

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
