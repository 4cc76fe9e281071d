"""Logging keeps working after whatever lent the process a stderr for a while has closed it."""

from __future__ import annotations

import io
import json
import sys

import pytest
import structlog

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
