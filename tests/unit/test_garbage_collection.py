"""A worker settles Python's garbage collector once, when it has built what it serves with and
before its loop starts (handlers/garbage_collection.py says what it saves)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

import handlers.app
from handlers.garbage_collection import settle_before_serving
from orchestrator.settings import Settings


@pytest.fixture(autouse=True)
def _collector_as_before() -> Iterator[None]:
    """This test process's collector goes back to how it was: nothing frozen, its thresholds."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


class BuiltBeforeServing:
    """An object the process built before it served, in a reference cycle with itself."""

    def __init__(self) -> None:
        self.me = self


def test_what_was_alive_before_serving_is_left_out_of_every_collection() -> None:
    gc.unfreeze()
    built = BuiltBeforeServing()

    settle_before_serving()

    assert gc.is_tracked(built)  # still known to the collector ...
    assert not any(obj is built for obj in gc.get_objects())  # ... in no generation it walks


def test_the_young_generation_is_collected_every_ten_thousand_objects_not_every_700() -> None:
    settle_before_serving()

    assert gc.get_threshold()[0] == 10_000


def test_garbage_left_by_the_start_is_collected_not_frozen() -> None:
    gc.unfreeze()
    collected: list[bool] = []
    garbage = CycleOfGarbage(collected)
    del garbage  # a cycle: reference counting alone never frees it

    settle_before_serving()

    assert collected == [True]


def test_the_worker_command_settles_the_collector_just_before_its_loop_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gc.unfreeze()
    seen: dict[str, Any] = {}

    class Runner:
        def execute_from_commandline(self) -> None:
            seen["frozen"] = gc.get_freeze_count()
            seen["threshold"] = gc.get_threshold()

    monkeypatch.setattr(handlers.app, "foreground", lambda app, *, log_level: Runner())
    worker: Any = SimpleNamespace(app=object())

    handlers.app.run_worker(worker, Settings.from_env({}), log_level="info")

    assert seen["frozen"] > 0
    assert seen["threshold"][0] == 10_000


class CycleOfGarbage:
    """Refers to itself; says on *collected* when the collector freed it."""

    def __init__(self, collected: list[bool]) -> None:
        self.me = self
        self.collected = collected

    def __del__(self) -> None:
        self.collected.append(True)
