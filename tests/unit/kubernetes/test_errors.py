"""Kubernetes API failures become the core's errors, named for what happens next."""

from __future__ import annotations

import json

import aiohttp
import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from orchestrator.errors import JobRejectedError, TransientBackendError
from runtimes.kubernetes.errors import translate


def api_error(status, reason, message="", headers=None):
    exc = ApiException(
        status=status,
        reason=reason,
        body=json.dumps({"kind": "Status", "reason": reason, "message": message}),
    )
    exc.headers = headers
    return exc


@pytest.mark.parametrize("status", [500, 503, 504])
def test_server_errors_are_transient(status):
    error = translate(api_error(status, "InternalError", "etcd is down"), doing="create x")
    assert isinstance(error, TransientBackendError)
    assert "etcd is down" in str(error)


def test_too_many_requests_waits_as_long_as_the_server_asks():
    error = translate(api_error(429, "TooManyRequests", headers={"Retry-After": "7"}), doing="x")
    assert isinstance(error, TransientBackendError)
    assert error.delay == 7.0


@pytest.mark.parametrize(
    "exc",
    [
        urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out"),
        urllib3.exceptions.MaxRetryError(None, "/", "connection refused"),
        ConnectionRefusedError("refused"),
        TimeoutError("slow"),
        aiohttp.ServerDisconnectedError(),
        aiohttp.ClientOSError(104, "Connection reset by peer"),
        aiohttp.ClientPayloadError("Response payload is not completed"),
    ],
    ids=[
        "read-timeout",
        "max-retry",
        "refused",
        "timeout",
        "aiohttp-disconnected",
        "aiohttp-reset",
        "aiohttp-cut-short",
    ],
)
def test_timeouts_and_refused_connections_are_transient(exc):
    assert isinstance(translate(exc, doing="x"), TransientBackendError)


def test_validation_errors_are_permanent_and_carry_the_servers_message():
    message = 'TrainJob.trainer.kubeflow.org "x" is invalid: spec.trainer.numNodes: Invalid value'
    error = translate(api_error(422, "Invalid", message), doing="create TrainJob ml/x")
    assert isinstance(error, JobRejectedError)
    assert error.reason == "Invalid"
    assert message in str(error)
    assert "create TrainJob ml/x" in str(error)


def test_a_body_that_is_not_json_is_still_reported():
    exc = ApiException(status=400, reason="Bad Request", body="not json")
    error = translate(exc, doing="x")
    assert isinstance(error, JobRejectedError)
    assert "not json" in str(error)


def test_without_retry_after_the_callers_backoff_is_the_delay():
    assert translate(api_error(503, "ServiceUnavailable"), doing="x", retry_delay=0.4).delay == 0.4
    assert translate(ConnectionRefusedError(), doing="x", retry_delay=0.8).delay == 0.8
