"""Kubernetes API failures, translated into the core's errors (named for what happens next).

Called by `backend.py` and `catalog.py` around every API call, of the synchronous client or
of `async_api.py` (which raises `ApiException` as that client does). The rules:

* 5xx, 429, timeouts and refused connections: `TransientBackendError` (retry with backoff;
  429 honours `Retry-After`);
* 4xx (validation `Invalid`, `BadRequest`, `NotFound`, `Forbidden`): `JobRejectedError` carrying
  the API server's own message, because asking again gets the same answer;
* 409 `AlreadyExists` on create is not decided here: only the backend can tell our job (same
  decision) from a foreign object with the same name, see `foreign_object_error`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from orchestrator.errors import BackendError, JobRejectedError, TransientBackendError

DEFAULT_RETRY_DELAY = 1.0
"""Seconds to wait before retrying when the server did not say (no `Retry-After`)."""


def api_message(exc: ApiException) -> tuple[str, str]:
    """(reason, message) from the `Status` object the API server sent, or from the HTTP line."""
    reason = str(exc.reason or "")
    message = ""
    if exc.body:
        try:
            status = json.loads(exc.body)
        except ValueError:
            message = str(exc.body)[:2000]
        else:
            if isinstance(status, dict):
                reason = str(status.get("reason") or reason)
                message = str(status.get("message") or "")
    return reason or f"HTTP{exc.status}", message or f"HTTP {exc.status} {exc.reason}"


def _retry_after(exc: ApiException, default: float) -> float:
    headers: Mapping[str, Any] = exc.headers or {}
    value = headers.get("Retry-After") or headers.get("retry-after")
    try:
        return max(float(value), 0.0) if value is not None else default
    except (TypeError, ValueError):
        return default


def is_transient(exc: BaseException) -> bool:
    """Whether asking again later may succeed."""
    if isinstance(exc, ApiException):
        status = exc.status or 0
        if status == 404 and exc.body and not _is_status_object(exc.body):
            # A bare "404 page not found": the route itself is not served yet, which is what
            # an API server answers for custom resources in the seconds after it restarts,
            # before its CRD handlers are installed (found by tests/e2e/test_fault_api_outage).
            # A missing object is a `Status` with reason NotFound, and stays permanent.
            return True
        return status in {0, 429} or status >= 500
    # urllib3's errors come from the synchronous client, aiohttp's from `async_api.py`: a
    # connection refused, reset or closed mid-answer, or a TLS handshake that failed.
    return isinstance(
        exc, urllib3.exceptions.HTTPError | aiohttp.ClientError | ConnectionError | TimeoutError
    )


def _is_status_object(body: Any) -> bool:
    try:
        document = json.loads(body) if body else None
    except (TypeError, ValueError):
        return False
    return isinstance(document, dict) and document.get("kind") == "Status"


def translate(
    exc: BaseException, *, doing: str, retry_delay: float = DEFAULT_RETRY_DELAY
) -> BackendError:
    """The core error for *exc*, raised while *doing* (e.g. "create TrainJob ft-x").

    Args:
        exc: what the kubernetes client raised.
        doing: what was being attempted, for the message.
        retry_delay: the `delay` of a transient error when the server did not name one
            (`Retry-After`); callers pass their current backoff.

    Returns:
        `TransientBackendError` or `JobRejectedError`; the caller raises it `from exc`.
    """
    if isinstance(exc, ApiException):
        reason, message = api_message(exc)
        if is_transient(exc):
            return TransientBackendError(
                f"{doing}: API server answered {exc.status} {reason}: {message}",
                delay=_retry_after(exc, retry_delay),
            )
        return JobRejectedError(f"{doing}: {message}", reason=reason)
    if is_transient(exc):
        return TransientBackendError(f"{doing}: API server unreachable: {exc}", delay=retry_delay)
    return JobRejectedError(f"{doing}: {type(exc).__name__}: {exc}", reason="ClientError")


def foreign_object_error(name: str, *, namespace: str, owner: str) -> JobRejectedError:
    """A TrainJob named *name* exists and is not the job of this decision."""
    return JobRejectedError(
        f"TrainJob {namespace}/{name} already exists and belongs to {owner}; tuneloop will not "
        "adopt or replace it. Delete it or change the rule so that its job names differ.",
        reason="NameTaken",
    )
