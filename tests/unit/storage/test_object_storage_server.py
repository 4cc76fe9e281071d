"""The harness's choice of S3 server (devservices/object_storage.py), without starting one."""

from __future__ import annotations

from pathlib import Path

import pytest

from devservices.object_storage import (
    ObjectStorageUnavailableError,
    object_storage_for_tests,
    server_command,
)


def test_an_external_endpoint_is_used_as_is_with_the_standard_credentials(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TUNELOOP_S3_ENDPOINT_URL", "http://s3.example:8333")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")

    with object_storage_for_tests(tmp_path) as endpoint:
        assert endpoint.endpoint_url == "http://s3.example:8333"
        assert (endpoint.access_key_id, endpoint.region) == ("AKIDEXAMPLE", "eu-west-3")
        assert endpoint.server is None


def test_an_external_endpoint_without_credentials_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TUNELOOP_S3_ENDPOINT_URL", "http://s3.example:8333")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)

    with (
        pytest.raises(ObjectStorageUnavailableError, match="AWS_ACCESS_KEY_ID"),
        object_storage_for_tests(tmp_path),
    ):
        pass


def test_the_server_runs_the_jar_with_its_properties_file() -> None:
    command = server_command(
        java="/usr/bin/java", jar=Path("/c/s3proxy.jar"), properties=Path("/w/s3proxy.properties")
    )

    assert command[0] == "/usr/bin/java"
    assert command[-4:] == ["-jar", "/c/s3proxy.jar", "--properties", "/w/s3proxy.properties"]
