"""Logging keeps working after whatever lent the process a stderr for a while has closed it,
and a worker builds no log records below its level."""

from __future__ import annotations

import io
import json
import logging
import sys

import faust
import pytest
import structlog

from handlers.app import foreground
from handlers.logs import configure


@pytest.fixture(autouse=True)
def _restore_structlog():
    yield
    structlog.reset_defaults()


def test_a_line_logged_after_the_lent_stderr_closed_goes_to_the_stderr_of_now(monkeypatch):
    lent = io.StringIO()
    monkeypatch.setattr(sys, "stderr", lent)
    configure("info")
    log = structlog.get_logger("tuneloop.test")
    log.info("while_lent")
    lent.close()

    now = io.StringIO()
    monkeypatch.setattr(sys, "stderr", now)
    log.info("after_it_closed", n=1)

    line = json.loads(now.getvalue())
    assert (line["event"], line["n"], line["level"]) == ("after_it_closed", 1, "info")


@pytest.fixture
def _restore_logging():
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


@pytest.mark.usefixtures("_restore_logging")
@pytest.mark.parametrize("level", ["warning", "error"])
def test_a_worker_logging_at_warning_or_above_builds_no_debug_records(level) -> None:
    # faust's own Worker sets the root logger to DEBUG at these levels (for its spinner)
    runner = foreground(faust.App("log-level-test", broker="kafka://127.0.0.1:1"), log_level=level)
    runner._setup_logging()

    for library in ("aiokafka.producer.producer", "aiokafka.consumer.fetcher", "faust.topics"):
        assert not logging.getLogger(library).isEnabledFor(logging.DEBUG), library
    assert logging.getLogger("aiokafka").isEnabledFor(getattr(logging, level.upper()))
