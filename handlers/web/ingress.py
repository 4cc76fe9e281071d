"""`POST /events`: CloudEvents over HTTP into the input topic, as a Knative sink.

The composition root (`handlers/app.py`) gives the web server `routes(...)` with the
intake's own validation (`Intake.admission`) and a `Forward` that writes through the
worker's producer. A request is turned into the Kafka record the binding would make of it
(binary: `ce-*` headers become `ce_*` headers; structured and batched: the body with its
`content-type`), judged by the same `admit` as a record read from Kafka, and written,
unchanged, to the first input topic, where the intake reads it like any other.

The answers follow the Knative sink contract (a sender retries 404, 408, 409, 429 and 5xx):

- **202** once the record is on the input topic and the broker acknowledged it.
- **400** when `admit` refuses it, with the dead-letter code and reason as JSON; nothing is
  written. A valid event that no rule wants is accepted (202), never 404: the intake counts
  it as unrouted, as it would from Kafka.
- **503** with `Retry-After` when the broker does not acknowledge within
  `ingress_ack_timeout` or the producer is not running. The record may still arrive after a
  timeout; the sender's retry is then a duplicate by (`source`, `id`), which the intake skips.
- **401** without the configured credential (a bearer token, or a client certificate under
  mTLS); **403** from a non-loopback address when neither is configured. Addresses in
  `ingress_trusted_networks` need no credential (a Knative broker attaches no static token).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from urllib.parse import unquote

import structlog
from aiohttp import web

from handlers.codec import CONTENT_TYPE_HEADER, HEADER_PREFIX, KafkaRecord
from handlers.intake import Admission
from handlers.web.metrics import IngressStats
from orchestrator.errors import InvalidEventError

log = structlog.get_logger("tuneloop.ingress")

Forward = Callable[[KafkaRecord], Awaitable[None]]
"""Write a record to the input topic and return once the broker acknowledged it."""

RETRY_AFTER_SECONDS = 5
"""What a 503 asks the sender to wait before it tries again."""

HTTP_HEADER_PREFIX = "ce-"


class Credentials:
    """Who may send: a bearer token, a client certificate (mTLS), an address in a trusted
    network; with no token and no mTLS, also loopback (and only loopback without networks)."""

    def __init__(
        self,
        *,
        token: str | None,
        client_certificates: bool,
        trusted_networks: Sequence[str] = (),
    ) -> None:
        self._token = token.encode("utf-8") if token else None
        self._client_certificates = client_certificates
        self._networks = tuple(ipaddress.ip_network(n, strict=False) for n in trusted_networks)

    def refusal(self, request: web.Request) -> web.Response | None:
        """None when *request* may send; otherwise the answer that refuses it."""
        address = _address(request.remote)
        if address is not None and any(address in network for network in self._networks):
            return None
        if self._token is None and not self._client_certificates:
            if address is not None and address.is_loopback:
                return None
            return _problem(
                403,
                "forbidden",
                "no ingress credential is configured (TUNELOOP_INGRESS_TOKEN, mTLS or "
                "TUNELOOP_INGRESS_TRUSTED_NETWORKS), so only loopback may send",
            )
        if self._token is not None:
            scheme, _, given = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() == "bearer" and hmac.compare_digest(
                given.strip().encode("utf-8"), self._token
            ):
                return None
        transport = request.transport
        if self._client_certificates and transport and transport.get_extra_info("peercert"):
            return None  # the TLS handshake verified it against the client CA
        answer = _problem(401, "unauthorized", "a valid bearer token or client certificate")
        answer.headers["WWW-Authenticate"] = 'Bearer realm="tuneloop"'
        return answer


def record_from_http(headers: list[tuple[str, str]], body: bytes) -> KafkaRecord:
    """The Kafka record the CloudEvents bindings make of an HTTP request.

    Binary mode's `ce-<name>` headers become `ce_<name>` (values percent-decoded, as the HTTP
    binding asks); `content-type` is kept as it is (in structured and batched mode it is what
    says so). Other headers are not part of the event and are left behind.
    """
    kept: list[tuple[str, bytes]] = []
    for name, value in headers:
        lower = name.lower()
        if lower.startswith(HTTP_HEADER_PREFIX) and len(lower) > len(HTTP_HEADER_PREFIX):
            attribute = lower[len(HTTP_HEADER_PREFIX) :]
            kept.append((f"{HEADER_PREFIX}{attribute}", unquote(value).encode("utf-8")))
        elif lower == CONTENT_TYPE_HEADER:
            kept.append((CONTENT_TYPE_HEADER, value.encode("utf-8")))
    return KafkaRecord(value=body or None, headers=tuple(kept), key=None)


def routes(
    *,
    admission: Admission,
    forward: Forward,
    credentials: Credentials,
    stats: IngressStats,
    ack_timeout: float,
    now: Callable[[], datetime],
) -> web.RouteTableDef:
    """`POST /events` (and the CloudEvents webhook handshake, `OPTIONS /events`)."""
    table = web.RouteTableDef()

    @table.post("/events")
    async def events(request: web.Request) -> web.Response:
        answer = await _take(request)
        stats.responses[answer.status] += 1
        return answer

    async def _take(request: web.Request) -> web.Response:
        refused = credentials.refusal(request)
        if refused is not None:
            return refused
        raw = await request.read()
        request_record = record_from_http(list(request.headers.items()), raw)
        try:
            admitted = admission(request_record, now())
        except InvalidEventError as exc:
            stats.rejected[str(exc.code)] += 1
            log.info("ingress_refused", code=str(exc.code), reason=exc.message[:200])
            return _problem(400, str(exc.code), exc.message)
        key = admitted[0].extensions.get("partitionkey") if len(admitted) == 1 else None
        record = KafkaRecord(
            value=request_record.value,
            headers=request_record.headers,
            key=str(key).encode("utf-8") if key is not None and str(key) else None,
        )
        try:
            await asyncio.wait_for(forward(record), timeout=ack_timeout)
        except Exception as exc:  # timeout, producer stopped, broker error: the sender retries
            log.warning("ingress_unacknowledged", error=repr(exc), events=len(admitted))
            answer = _problem(
                503, "unavailable", f"the broker did not acknowledge the event: {exc!r}"
            )
            answer.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
            return answer
        stats.events += len(admitted)
        return web.json_response({"accepted": [event.id for event in admitted]}, status=202)

    @table.route("OPTIONS", "/events")
    async def handshake(request: web.Request) -> web.Response:
        # The CloudEvents HTTP webhook spec's abuse protection: a sender asks first.
        origin = request.headers.get("WebHook-Request-Origin")
        headers = {"Allow": "POST, OPTIONS"}
        if origin:
            headers["WebHook-Allowed-Origin"] = origin
            headers["WebHook-Allowed-Rate"] = "*"
        return web.Response(status=200, headers=headers)

    return table


def _problem(status: int, code: str, reason: str) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps({"code": code, "reason": reason}),
        content_type="application/json",
    )


def _address(remote: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not remote:
        return None
    try:
        address = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:  # a Unix socket peer has no address; not a sender we serve
        return None
    # An IPv4 sender on a dual-stack socket shows as ::ffff:a.b.c.d.
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address
