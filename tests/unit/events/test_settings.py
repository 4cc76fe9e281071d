"""Settings from the environment: defaults, parsing, and refusing unsafe combinations."""

from __future__ import annotations

from datetime import timedelta

import pytest

from orchestrator.errors import ConfigError
from orchestrator.settings import OutputMode, SaslMechanism, SecurityProtocol, Settings


def test_defaults_point_at_the_local_broker_and_bound_age_below_dedup_memory() -> None:
    kafka = Settings.from_env({}).kafka
    assert kafka.bootstrap == "127.0.0.1:9092"
    assert kafka.output_mode is OutputMode.BINARY
    assert kafka.max_age is not None
    assert kafka.max_age <= kafka.dedup_ttl


def test_every_kafka_variable_is_read() -> None:
    kafka = Settings.from_env(
        {
            "TUNELOOP_KAFKA_BOOTSTRAP": "b1:9093,b2:9093",
            "TUNELOOP_KAFKA_TOPICS_IN": "drift, data ,",
            "TUNELOOP_KAFKA_TOPIC_DLQ": "dlq",
            "TUNELOOP_KAFKA_GROUP_ID": "g",
            "TUNELOOP_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
            "TUNELOOP_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "TUNELOOP_KAFKA_SASL_USERNAME": "u",
            "TUNELOOP_KAFKA_SASL_PASSWORD": "secret",
            "TUNELOOP_KAFKA_TLS_CA_FILE": "/ca.pem",
            "TUNELOOP_KAFKA_MAX_EVENT_BYTES": "2048",
            "TUNELOOP_KAFKA_MAX_AGE": "60",
            "TUNELOOP_KAFKA_DEDUP_TTL": "120",
            "TUNELOOP_KAFKA_OUTPUT_MODE": "structured",
        }
    ).kafka
    assert kafka.topics_in == ("drift", "data")
    assert kafka.security_protocol is SecurityProtocol.SASL_SSL
    assert kafka.sasl_mechanism is SaslMechanism.SCRAM_SHA_512
    assert kafka.uses_tls
    assert kafka.max_age == timedelta(seconds=60)
    assert kafka.output_mode is OutputMode.STRUCTURED
    assert "secret" not in repr(kafka)


def test_max_age_can_be_switched_off() -> None:
    assert Settings.from_env({"TUNELOOP_KAFKA_MAX_AGE": "none"}).kafka.max_age is None
    assert Settings.from_env({"TUNELOOP_KAFKA_MAX_AGE": "0"}).kafka.max_age is None


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"TUNELOOP_KAFKA_MAX_EVENT_BYTES": "lots"}, "TUNELOOP_KAFKA_MAX_EVENT_BYTES"),
        ({"TUNELOOP_KAFKA_OUTPUT_MODE": "xml"}, "TUNELOOP_KAFKA_OUTPUT_MODE"),
        ({"TUNELOOP_KAFKA_MAX_AGE": "999999"}, "TUNELOOP_KAFKA_DEDUP_TTL"),
        ({"TUNELOOP_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "TUNELOOP_KAFKA_SASL_MECHANISM"),
        ({"TUNELOOP_KAFKA_TLS_CERT_FILE": "/c.pem"}, "TUNELOOP_KAFKA_TLS_KEY_FILE"),
        ({"TUNELOOP_KAFKA_TOPICS_IN": " , "}, "TUNELOOP_KAFKA_TOPICS_IN"),
    ],
    ids=[
        "not-integer",
        "unknown-mode",
        "age-beyond-dedup",
        "sasl-incomplete",
        "mtls-half",
        "no-topics",
    ],
)
def test_bad_settings_refuse_to_start_naming_the_variable(env: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Settings.from_env(env)
