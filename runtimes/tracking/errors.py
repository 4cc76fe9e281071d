"""Tracking errors, named for what happens next. None of them ever fails a training run.

    TrackingError                   the run's tracking is incomplete; training goes on
      TrackingUnavailableError      the server could not be reached, timed out or answered 5xx:
                                    the trainer stops tracking this run (one warning), the
                                    champion store asks the service to try again later
      TrackingRequestError          the server answered and refused (4xx, with MLflow's
                                    `error_code`): that one step is skipped with a warning

The trainer (`runtimes/tracking/runs.py`) turns each into a warning; the champion store
(`runtimes/tracking/champions.py`) into `orchestrator.errors.TransientBackendError`.
"""

from __future__ import annotations


class TrackingError(Exception):
    """A call to the tracking server did not do what was asked."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class TrackingUnavailableError(TrackingError):
    """The server could not be reached, timed out, or failed (5xx): try again later."""


class TrackingRequestError(TrackingError):
    """The server refused the request; `error_code` is MLflow's (`RESOURCE_DOES_NOT_EXIST`)."""

    def __init__(self, message: str, *, status: int, error_code: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code

    @property
    def not_found(self) -> bool:
        return self.error_code == "RESOURCE_DOES_NOT_EXIST"

    @property
    def already_exists(self) -> bool:
        return self.error_code == "RESOURCE_ALREADY_EXISTS"
