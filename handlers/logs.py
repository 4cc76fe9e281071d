"""Logging for processes tuneloop starts: structlog, one line per outcome.

JSON lines off a terminal (for log collectors), readable lines on one; below *level* nothing
is rendered. Standard-library loggers (faust, aiokafka) go through the same level. Called once
by `tuneloop run`.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


class _StderrLogger:
    """structlog's `PrintLogger`, but to `sys.stderr` as it is at each line, not as it was
    when logging was configured: whatever lends the process another stderr for a while
    (pytest's capture, typer's test runner) closes it afterwards, and a logger bound to it
    would then fail every later line with "I/O operation on closed file"."""

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def _stderr_logger(*_names: Any) -> _StderrLogger:
    return _StderrLogger()


def configure(level: str = "info") -> None:
    """Set up structlog and the standard logging module for a long-running process."""
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    logging.basicConfig(
        level=numeric, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s"
    )
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer()
        if sys.stderr.isatty()
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=True,
    )
