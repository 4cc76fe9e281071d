"""Who may send to `POST /events`, and what an HTTP request is as a Kafka record.

Requests are aiohttp's own (`make_mocked_request`), each from the peer address a real
connection would report.
"""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request

from handlers.codec import KafkaRecord
from handlers.web.ingress import Credentials, record_from_http


class Peer:
    """The transport of a connection from *address*, with or without a verified certificate."""

    def __init__(self, address: str, *, certificate: dict[str, Any] | None = None) -> None:
        self._extra = {"peername": (address, 50000), "peercert": certificate}

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)


def request_from(address: str, *, certificate: Any = None, **headers: str) -> Any:
    return make_mocked_request(
        "POST", "/events", headers=headers, transport=Peer(address, certificate=certificate)
    )


def status(credentials: Credentials, request: Any) -> int:
    refused = credentials.refusal(request)
    return 202 if refused is None else refused.status


NO_CREDENTIAL = Credentials(token=None, client_certificates=False)


@pytest.mark.parametrize(
    ("address", "expected"),
    [("127.0.0.1", 202), ("::1", 202), ("::ffff:127.0.0.1", 202), ("10.1.2.3", 403)],
    ids=["ipv4-loopback", "ipv6-loopback", "mapped-loopback", "pod-address"],
)
def test_without_a_credential_only_loopback_may_send(address: str, expected: int) -> None:
    assert status(NO_CREDENTIAL, request_from(address)) == expected


def test_with_a_token_every_sender_needs_it_loopback_included() -> None:
    credentials = Credentials(token="t0ken", client_certificates=False)
    assert status(credentials, request_from("127.0.0.1")) == 401
    assert status(credentials, request_from("10.1.2.3", Authorization="Bearer wrong")) == 401
    assert status(credentials, request_from("10.1.2.3", Authorization="Bearer t0ken")) == 202
    assert status(credentials, request_from("10.1.2.3", Authorization="bearer t0ken")) == 202


def test_under_mtls_a_verified_client_certificate_is_the_credential() -> None:
    credentials = Credentials(token=None, client_certificates=True)
    verified = {"subject": ((("commonName", "knative-broker"),),)}
    assert status(credentials, request_from("10.1.2.3")) == 401
    assert status(credentials, request_from("10.1.2.3", certificate=verified)) == 202


def test_a_trusted_network_needs_no_credential_and_others_still_do() -> None:
    credentials = Credentials(
        token="t0ken", client_certificates=False, trusted_networks=("10.244.0.0/16",)
    )
    assert status(credentials, request_from("10.244.7.9")) == 202
    assert status(credentials, request_from("10.1.2.3")) == 401


def test_binary_mode_headers_become_the_kafka_bindings_headers_percent_decoded() -> None:
    record = record_from_http(
        [
            ("CE-ID", "e-1"),
            ("ce-source", "/monitors/psi"),
            ("ce-subject", "caf%C3%A9%20menu"),
            ("Content-Type", "application/json"),
            ("User-Agent", "knative"),
        ],
        b'{"x": 1}',
    )
    assert record == KafkaRecord(
        value=b'{"x": 1}',
        headers=(
            ("ce_id", b"e-1"),
            ("ce_source", b"/monitors/psi"),
            ("ce_subject", "café menu".encode()),
            ("content-type", b"application/json"),
        ),
        key=None,
    )
