from __future__ import annotations

import pytest

from runtimes.storage import InvalidLocationError, StorageSettings


def test_the_standard_aws_variables_configure_the_store() -> None:
    settings = StorageSettings.from_env(
        {
            "AWS_ENDPOINT_URL_S3": "http://s3.internal:9000",
            "AWS_REGION": "eu-west-3",
            "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
            "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI",
            "AWS_SESSION_TOKEN": "token",
        }
    )

    assert settings.endpoint_url == "http://s3.internal:9000"
    assert settings.region == "eu-west-3"
    assert settings.access_key_id == "AKIDEXAMPLE"
    assert settings.secret_access_key == "wJalrXUtnFEMI"
    assert settings.session_token == "token"


def test_tuneloops_endpoint_variable_wins_over_the_aws_ones() -> None:
    settings = StorageSettings.from_env(
        {
            "TUNELOOP_S3_ENDPOINT_URL": "http://127.0.0.1:8080",
            "AWS_ENDPOINT_URL_S3": "http://elsewhere:9000",
            "AWS_ENDPOINT_URL": "http://global:9000",
        }
    )

    assert settings.endpoint_url == "http://127.0.0.1:8080"


def test_nothing_set_means_aws_defaults_and_the_sdks_own_credential_chain() -> None:
    settings = StorageSettings.from_env({"AWS_DEFAULT_REGION": "", "AWS_ACCESS_KEY_ID": " "})

    assert settings.endpoint_url is None
    assert settings.region == "us-east-1"
    assert not settings.has_static_credentials


def test_a_key_id_without_its_secret_is_refused() -> None:
    with pytest.raises(InvalidLocationError, match="must be set together"):
        StorageSettings.from_env({"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE"})


def test_the_secrets_never_appear_in_the_settings_repr() -> None:
    settings = StorageSettings(access_key_id="AKIDEXAMPLE", secret_access_key="wJalrXUtnFEMI")

    assert "wJalrXUtnFEMI" not in repr(settings)
    assert "AKIDEXAMPLE" not in repr(settings)
