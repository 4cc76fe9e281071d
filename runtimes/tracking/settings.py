"""Where the MLflow tracking server is and who we are to it: from the environment.

The trainer reads it with `TrackingSettings.from_env()`, as it reads its storage settings; the
worker's composition root (`handlers/app.py`) builds it from `Settings.mlflow` and the same
credential variables. The credentials use MLflow's own variable names, so a Secret written for
MLflow's client configures tuneloop too; they are never logged and never put in a TrainJob
(the Kubernetes backend passes only the URI; credentials come from the runtime's Secret).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from runtimes.tracking.context import TRACKING_URI_VARIABLE

TIMEOUT_VARIABLE = "TUNELOOP_MLFLOW_REQUEST_TIMEOUT"
DEFAULT_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class TrackingSettings:
    """How to reach the tracking server; `tracking_uri` None means tracking is off."""

    tracking_uri: str | None = None
    """`http(s)://host:port` of an `mlflow server` (its REST API and, with
    `--serve-artifacts`, its artifact proxy). None: nothing is tracked."""

    request_timeout: float = DEFAULT_TIMEOUT
    """Seconds one call may take (default 10). The trainer waits for each call, so a server
    that hangs costs at most this once: after a failure the run stops tracking."""

    token: str | None = field(default=None, repr=False)
    """`MLFLOW_TRACKING_TOKEN`: sent as a bearer token."""

    username: str | None = field(default=None, repr=False)
    """`MLFLOW_TRACKING_USERNAME`, with `password`: HTTP basic authentication."""

    password: str | None = field(default=None, repr=False)
    """`MLFLOW_TRACKING_PASSWORD`."""

    def __post_init__(self) -> None:
        if self.request_timeout <= 0:
            raise ValueError(f"{TIMEOUT_VARIABLE} must be positive, not {self.request_timeout}")

    @property
    def enabled(self) -> bool:
        return self.tracking_uri is not None

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        tracking_uri: str | None = None,
        request_timeout: float | None = None,
    ) -> TrackingSettings:
        """Read the settings from *environ* (default `os.environ`); empty values count as
        unset. *tracking_uri* and *request_timeout*, when given, win over the environment
        (the worker passes what `Settings.mlflow` holds).

        Raises:
            ValueError: the timeout is not a positive number.
        """
        env = os.environ if environ is None else environ

        def read(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        uri = tracking_uri or read(TRACKING_URI_VARIABLE)
        timeout_text = read(TIMEOUT_VARIABLE)
        timeout = request_timeout
        if timeout is None and timeout_text is not None:
            try:
                timeout = float(timeout_text)
            except ValueError:
                raise ValueError(f"{TIMEOUT_VARIABLE}={timeout_text!r} is not a number") from None
        return cls(
            tracking_uri=uri.rstrip("/") if uri else None,
            request_timeout=timeout if timeout is not None else DEFAULT_TIMEOUT,
            token=read("MLFLOW_TRACKING_TOKEN"),
            username=read("MLFLOW_TRACKING_USERNAME"),
            password=read("MLFLOW_TRACKING_PASSWORD"),
        )
