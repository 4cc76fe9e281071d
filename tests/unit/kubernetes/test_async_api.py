"""What the pooled async client reads from the kubernetes client's `Configuration`: the
TLS settings, whether aiohttp can reach the server at all, and the API paths.

Requests themselves go to the real API server in tests/integration/test_kubernetes_async_api.py.
"""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

import pytest
from kubernetes import client

from devservices.kubernetes import make_certificates
from runtimes.kubernetes.async_api import Collection, supports, tls_context


@pytest.fixture
def api_client(tmp_path: Path) -> client.ApiClient:
    """A client configured as the kubeconfig loader configures one: CA and client certificate
    files, never called here."""
    certificates = make_certificates(tmp_path, now=datetime.datetime.now(datetime.UTC))
    configuration = client.Configuration(
        host="https://127.0.0.1:6443",
        ssl_ca_cert=str(certificates.ca),
        cert_file=str(certificates.client_cert),
        key_file=str(certificates.client_key),
    )
    return client.ApiClient(configuration)


def test_the_server_is_verified_by_name_against_the_configured_ca(api_client) -> None:
    context = tls_context(api_client)
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.check_hostname is True
    (authority,) = context.get_ca_certs()
    assert dict(field[0] for field in authority["subject"])["commonName"] == "tuneloop-local-ca"


def test_verify_ssl_false_checks_nothing(api_client) -> None:
    api_client.configuration.verify_ssl = False
    context = tls_context(api_client)
    assert context.verify_mode is ssl.CERT_NONE
    assert context.check_hostname is False


def test_assert_hostname_false_checks_the_chain_but_not_the_name(api_client) -> None:
    api_client.configuration.assert_hostname = False
    context = tls_context(api_client)
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.check_hostname is False


def test_a_client_key_that_does_not_match_its_certificate_is_refused_at_once(
    api_client, tmp_path: Path
) -> None:
    other = make_certificates(tmp_path / "other", now=datetime.datetime.now(datetime.UTC))
    api_client.configuration.key_file = str(other.client_key)
    with pytest.raises(ssl.SSLError):
        tls_context(api_client)


@pytest.mark.parametrize(
    ("proxy", "no_proxy", "expected"),
    [
        (None, None, True),
        ("http://proxy.internal:3128", None, True),
        ("socks5://proxy.internal:1080", None, False),
        ("socks5h://proxy.internal:1080", "10.0.0.0/8,127.0.0.1", True),
    ],
    ids=["no-proxy", "http-proxy", "socks-proxy", "socks-proxy-bypassed"],
)
def test_only_a_socks_proxy_in_the_way_keeps_the_synchronous_client(
    api_client, proxy, no_proxy, expected
) -> None:
    api_client.configuration.proxy = proxy
    api_client.configuration.no_proxy = no_proxy
    assert supports(api_client) is expected


def test_paths_name_the_collection_and_the_object() -> None:
    trainjobs = Collection("trainer.kubeflow.org", "v1alpha1", "ml-team", "trainjobs")
    assert trainjobs.path() == "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml-team/trainjobs"
    assert (
        trainjobs.path("ft-a1")
        == "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml-team/trainjobs/ft-a1"
    )
