"""Errors of tuneloop, named for what happens next.

    TuneloopError
      ConfigError               refuse to start; `tuneloop check` exits 1
      InvalidEventError         dead-letter with a reason, commit, never retry
      BackendError
        TransientBackendError   retry later: the service waits (at least `delay`) and calls
                                the backend again, holding the key's partition uncommitted
        JobRejectedError        the backend refused the job for good: publish
                                `finetune.failed`, record it, commit

Adapters translate foreign exceptions into these and chain them (`raise ... from exc`).
Retries have one owner, `orchestrator/service.py` (`RetryPolicy`): a backend tries once and
raises `TransientBackendError`. The intake (`handlers/intake.py`) maps what is left to
commit or dead-letter.
"""

from __future__ import annotations


class TuneloopError(Exception):
    """Base of every error tuneloop raises on purpose."""


class ConfigError(TuneloopError):
    """Settings or rule files are wrong: refuse to start (or keep the old rules on reload)."""


class InvalidEventError(TuneloopError):
    """An input record can never be processed: send it to the dead-letter topic.

    `code` is stable (documented in docs/dead-letters.md) so that operators can
    filter on it; `message` is for humans.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class BackendError(TuneloopError):
    """A training backend could not do what was asked."""


class TransientBackendError(BackendError):
    """Try again later: the backend is unavailable, overloaded or timed out."""

    def __init__(self, message: str, *, delay: float = 1.0) -> None:
        super().__init__(message)
        self.delay = delay


class JobRejectedError(BackendError):
    """The backend refused the job and will refuse it again (validation, missing runtime).

    The decision is recorded as failed and a `finetune.failed` event is published.
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
