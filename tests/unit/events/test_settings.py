"""Settings from the environment: defaults, parsing, and refusing unsafe combinations."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.settings import (
    BackendKind,
    OutputMode,
    SaslMechanism,
    SecurityProtocol,
    Settings,
)
from runtimes.kubernetes.backend import BackendSettings


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


def test_the_worker_defaults_to_the_local_backend_without_a_web_server() -> None:
    worker = Settings.from_env({}).worker
    assert worker.backend is BackendKind.LOCAL
    assert (worker.rules, worker.local_max_jobs, worker.web_port) == ((), 1, None)
    assert (worker.web_bind, worker.ingress_token) == ("127.0.0.1", None)


def test_the_web_port_variable_wins_over_its_old_name() -> None:
    both = {"TUNELOOP_WEB_PORT": "8080", "TUNELOOP_METRICS_PORT": "9090"}
    assert Settings.from_env(both).worker.web_port == 8080
    assert Settings.from_env({"TUNELOOP_METRICS_PORT": "9090"}).worker.web_port == 9090


def test_the_ingress_token_is_never_shown() -> None:
    worker = Settings.from_env({"TUNELOOP_INGRESS_TOKEN": "s3cret-token"}).worker
    assert worker.ingress_token == "s3cret-token"
    assert "s3cret-token" not in repr(worker)


def test_every_worker_variable_is_read() -> None:
    worker = Settings.from_env(
        {
            "TUNELOOP_RULES": "rules/a.yaml  rules/more",
            "TUNELOOP_BACKEND": "Kubernetes",
            "TUNELOOP_LOCAL_ROOT": "/var/jobs",
            "TUNELOOP_LOCAL_MAX_JOBS": "3",
            "TUNELOOP_KUBECONFIG": "/etc/kube/config",
            "TUNELOOP_WEB_PORT": "9464",
            "TUNELOOP_WEB_BIND": "0.0.0.0",
            "TUNELOOP_INGRESS_ACK_TIMEOUT": "2.5",
            "TUNELOOP_HEALTH_LOOP_STALL": "4",
            "TUNELOOP_HEALTH_PROGRESS_STALL": "60",
            "TUNELOOP_INGRESS_TRUSTED_NETWORKS": "10.244.0.0/16, fd00::/8",
        }
    ).worker
    assert worker.rules == (Path("rules/a.yaml"), Path("rules/more"))
    assert worker.backend is BackendKind.KUBERNETES
    assert worker.local_root == Path("/var/jobs")
    assert worker.local_max_jobs == 3
    assert worker.kubeconfig == Path("/etc/kube/config")
    assert (worker.web_port, worker.web_bind) == (9464, "0.0.0.0")
    assert worker.ingress_ack_timeout == 2.5
    assert (worker.health_loop_stall, worker.health_progress_stall) == (4.0, 60.0)
    assert worker.ingress_trusted_networks == ("10.244.0.0/16", "fd00::/8")


def test_kubernetes_settings_come_from_tuneloop_kubernetes_variables() -> None:
    kubernetes = Settings.from_env(
        {
            "TUNELOOP_KUBERNETES_NAMESPACE": "ml",
            "TUNELOOP_KUBERNETES_TRAINER_IMAGE": "registry.local/trainer:2",
            "TUNELOOP_KUBERNETES_JOBSET_TIMEOUT": "90",
            "TUNELOOP_KUBERNETES_MODEL_SECRET": "hf-token",
        }
    ).kubernetes
    assert kubernetes.namespace == "ml"
    assert kubernetes.trainer_image == "registry.local/trainer:2"
    assert kubernetes.jobset_timeout == 90.0
    assert kubernetes.model_secret == "hf-token"
    assert kubernetes.watch_timeout == 60  # unset: the default


def test_the_kubernetes_backend_gets_every_kubernetes_setting() -> None:
    backend = BackendSettings.from_settings(
        Settings.from_env(
            {
                "TUNELOOP_KUBERNETES_NAMESPACE": "ml",
                "TUNELOOP_KUBERNETES_REQUEST_TIMEOUT": "5",
                "TUNELOOP_KUBERNETES_WATCH_TIMEOUT": "30",
                "TUNELOOP_KUBERNETES_JOBSET_TIMEOUT": "90",
                "TUNELOOP_KUBERNETES_TRAINER_IMAGE": "registry.local/trainer:2",
                "TUNELOOP_KUBERNETES_OUTPUT_BASE_URI": "s3://adapters",
                "TUNELOOP_KUBERNETES_DATASET_SECRET": "data-token",
                "TUNELOOP_KUBERNETES_MODEL_SECRET": "hf-token",
            }
        ).kubernetes
    )
    assert (backend.namespace, backend.request_timeout, backend.watch_timeout) == ("ml", 5.0, 30)
    assert backend.jobset_timeout == 90.0
    assert backend.manifests.image == "registry.local/trainer:2"
    assert backend.manifests.output_base_uri == "s3://adapters"
    assert (backend.manifests.dataset_secret, backend.manifests.model_secret) == (
        "data-token",
        "hf-token",
    )


def test_unset_kubernetes_variables_give_the_backends_own_defaults() -> None:
    assert BackendSettings.from_settings(Settings.from_env({}).kubernetes) == BackendSettings()


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"TUNELOOP_KUBERNETES_JOBSET_TIMEOUT": "soon"}, "TUNELOOP_KUBERNETES_JOBSET_TIMEOUT"),
        ({"TUNELOOP_KUBERNETES_JOBSET_TIMEOUT": "0"}, "TUNELOOP_KUBERNETES_JOBSET_TIMEOUT"),
        ({"TUNELOOP_KUBERNETES_REQUEST_TIMEOUT": "-5"}, "TUNELOOP_KUBERNETES_REQUEST_TIMEOUT"),
        ({"TUNELOOP_BACKEND": "slurm"}, "TUNELOOP_BACKEND"),
        ({"TUNELOOP_LOCAL_MAX_JOBS": "0"}, "TUNELOOP_LOCAL_MAX_JOBS"),
        ({"TUNELOOP_WEB_PORT": "70000"}, "TUNELOOP_WEB_PORT"),
        ({"TUNELOOP_WEB_TLS_CERT_FILE": "/tls/cert.pem"}, "TUNELOOP_WEB_TLS_KEY_FILE"),
        ({"TUNELOOP_WEB_TLS_CLIENT_CA_FILE": "/tls/ca.pem"}, "TUNELOOP_WEB_TLS_CERT_FILE"),
        ({"TUNELOOP_INGRESS_ACK_TIMEOUT": "0"}, "TUNELOOP_INGRESS_ACK_TIMEOUT"),
        ({"TUNELOOP_INGRESS_TRUSTED_NETWORKS": "10.0.0.0/8,pods"}, "not a network"),
    ],
    ids=[
        "timeout-not-a-number",
        "timeout-zero",
        "timeout-negative",
        "backend",
        "jobs",
        "port",
        "tls-without-key",
        "mtls-without-cert",
        "ack-timeout",
        "trusted-network",
    ],
)
def test_bad_worker_and_kubernetes_settings_refuse_to_start(env: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Settings.from_env(env)
