"""The worker's web server, on a running worker and the real broker.

Metrics are read with prometheus_client's own parser, and events are sent over HTTP as the
CloudEvents SDK's HTTP binding writes them (binary, structured) and as its JSON format
writes a batch: both are someone else's implementation, not ours.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cloudevents.core.bindings import http as sdk_http
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent as SdkEvent
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from cryptography.x509.oid import NameOID
from prometheus_client.parser import text_string_to_metric_families

from handlers.app import Worker
from handlers.codec import KafkaRecord
from orchestrator.clock import SystemClock
from orchestrator.jobs.model import JobPhase, JobRef, TrainingRequest
from orchestrator.settings import WorkerSettings
from orchestrator.testing import InMemoryBackend
from tests.fixtures.kafka import TopicFactory
from tests.fixtures.topics import read_decisions, send_records
from tests.fixtures.waiting import wait_for
from tests.fixtures.worker import build_test_worker, running, worker_settings, worker_topics

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

RULE = "drift-retrain"
RULES = f"""
runtimes: [torch-distributed]
rules:
  - name: {RULE}
    on:
      type: io.tuneloop.drift.detected.v1
    key: "event.data.model_id"
    window: 6h
    count: 2
    concurrency: forbid
    launch:
      runtime: torch-distributed
      base_model: "tiny"
      dataset: "file:///data/${{ key }}.jsonl"
"""


def drift_event(event_id: str, model: str = "m1") -> SdkEvent:
    """A drift alarm that happened ten minutes before it is made (at the call, not at import:
    in a whole suite this module is imported many minutes before its tests run)."""
    return SdkEvent(
        attributes={
            "id": event_id,
            "source": "/monitors/psi",
            "type": "io.tuneloop.drift.detected.v1",
            "time": datetime.now(UTC) - timedelta(minutes=10),
            "datacontenttype": "application/json",
        },
        data={"model_id": model, "metric": "psi", "value": 0.3, "threshold": 0.2},
    )


Scrape = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(session: aiohttp.ClientSession, url: str) -> Scrape:
    async with session.get(f"{url}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Scrape, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def topics(new_topic: TopicFactory) -> dict[str, str]:
    return worker_topics(new_topic, "web")


@asynccontextmanager
async def running_worker(
    bootstrap: str,
    topics: dict[str, str],
    rules: Path,
    *,
    backend: InMemoryBackend | None = None,
    **web: Any,
) -> AsyncIterator[tuple[Worker, InMemoryBackend]]:
    backend = backend or InMemoryBackend(SystemClock())
    worker = build_test_worker(
        worker_settings(bootstrap, topics, worker=WorkerSettings(web_port=0, **web)),
        rules=rules,
        backend=backend,
        reload_interval=0.2,
    )
    async with running(worker):
        yield worker, backend


async def audited_event_ids(bootstrap: str, topic: str) -> set[str]:
    return {i for decision in await read_decisions(bootstrap, topic) for i in decision["event_ids"]}


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return path


async def test_metrics_scraped_from_a_running_worker_move_as_events_arrive(
    kafka_bootstrap: str, topics: dict[str, str], rules: Path
) -> None:
    async with (
        running_worker(kafka_bootstrap, topics, rules) as (worker, backend),
        aiohttp.ClientSession() as http,
    ):
        assert worker.web is not None
        url = worker.web.url

        async def ready() -> bool:
            async with http.get(f"{url}/readyz") as response:
                return response.status == 200

        await wait_for(ready, what="/readyz", timeout=60, interval=0.2)
        async with http.get(f"{url}/healthz") as response:
            assert response.status == 200
        before = await scrape(http, url)
        assert value(before, "tuneloop_decisions_total", rule=RULE, outcome="launch") == 0
        assert value(before, "tuneloop_launch_latency_seconds_count") == 0

        records = []
        for n in (1, 2):
            message = sdk_http.to_binary_event(drift_event(f"metrics-{n}"))
            headers = tuple(
                (name.replace("ce-", "ce_", 1).lower(), text.encode())
                for name, text in message.headers.items()
            )
            records.append(KafkaRecord(value=message.body, headers=headers))
        records.append(KafkaRecord(value=b"not an event"))
        await send_records(kafka_bootstrap, topics["in"], records)

        async def launched_and_dead_lettered() -> bool:
            now = await scrape(http, url)
            return (
                value(now, "tuneloop_decisions_total", rule=RULE, outcome="launch") == 1
                and value(now, "tuneloop_dead_letters_total", code="record.not_cloudevent") == 1
            )

        await wait_for(
            launched_and_dead_lettered,
            what="the launch and the dead letter",
            timeout=60,
            interval=0.2,
        )
        after = await scrape(http, url)
        assert value(after, "tuneloop_decisions_total", rule=RULE, outcome="accumulate") == 1
        assert value(after, "tuneloop_intake_received_total") == 3
        # The events happened ten minutes before the job was created.
        assert value(after, "tuneloop_launch_latency_seconds_count") == 1
        assert 590 < value(after, "tuneloop_launch_latency_seconds_sum") < 900
        assert value(after, "tuneloop_launch_latency_seconds_bucket", le="300.0") == 0
        assert value(after, "tuneloop_launch_latency_seconds_bucket", le="900.0") == 1
        assert value(after, "tuneloop_jobs", phase="Pending") == 1
        assert 0 <= value(after, "tuneloop_event_loop_lag_seconds") < 10
        assert ("tuneloop_event_loop_lag_seconds", frozenset()) in after

        (job,) = backend.job_names
        backend.move(job, JobPhase.RUNNING)

        async def running() -> bool:
            return value(await scrape(http, url), "tuneloop_jobs", phase="Running") == 1

        await wait_for(running, what="the job's phase in /metrics", timeout=60, interval=0.2)

        async def lag_measured() -> bool:
            now = await scrape(http, url)
            return (
                "tuneloop_consumer_lag",
                frozenset({("topic", topics["in"]), ("partition", "0")}),
            ) in now

        await wait_for(lag_measured, what="the input partition's lag", timeout=60, interval=0.2)

        rules.write_text("rules: [this is not a rule]\n")

        async def reload_rejected() -> bool:
            now = await scrape(http, url)
            return value(now, "tuneloop_rule_reloads_total", result="rejected") == 1

        await wait_for(reload_rejected, what="the rejected reload", timeout=60, interval=0.2)
        rules.write_text(RULES.replace("count: 2", "count: 3"))

        async def reload_applied() -> bool:
            now = await scrape(http, url)
            return value(now, "tuneloop_rule_reloads_total", result="applied") == 1

        await wait_for(reload_applied, what="the applied reload", timeout=60, interval=0.2)
        async with http.get(f"{url}/healthz") as response:
            assert response.status == 200


def non_loopback_address() -> str | None:
    """This machine's address on its default route, if it has one."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.255", 9))  # no packet is sent for a UDP connect
        address = str(probe.getsockname()[0])
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


async def post(
    http: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> tuple[int, Any, Any]:
    async with http.post(f"{url}/events", data=body, headers=headers) as response:
        return response.status, await response.json(content_type=None), response.headers


async def test_events_posted_over_http_reach_a_decision_and_invalid_ones_are_refused(
    kafka_bootstrap: str, topics: dict[str, str], rules: Path
) -> None:
    async with (
        running_worker(kafka_bootstrap, topics, rules, web_bind="0.0.0.0") as (worker, _),
        aiohttp.ClientSession() as http,
    ):
        assert worker.web is not None
        url = f"http://127.0.0.1:{worker.web.port}"
        binary = sdk_http.to_binary_event(drift_event("http-binary", model="a"))
        structured = sdk_http.to_structured_event(drift_event("http-structured", model="a"))
        batch_body = b"[%s]" % b",".join(
            JSONFormat().write(drift_event(f"http-batch-{n}", model="b")) for n in (1, 2)
        )
        batch_headers = {"Content-Type": "application/cloudevents-batch+json"}
        unwanted = SdkEvent(
            attributes={
                "id": "http-unwanted",
                "source": "/ingest",
                "type": "io.tuneloop.data.arrived.v1",
                "datacontenttype": "application/json",
            },
            data={"dataset_id": "reviews", "uri": "s3://bucket/reviews/part-1", "rows": 10},
        )
        accepted = [
            await post(http, url, binary.body, binary.headers),
            await post(http, url, structured.body, structured.headers),
            await post(http, url, batch_body, batch_headers),
        ]
        assert [(status, body["accepted"]) for status, body, _ in accepted] == [
            (202, ["http-binary"]),
            (202, ["http-structured"]),
            (202, ["http-batch-1", "http-batch-2"]),
        ]
        unwanted_message = sdk_http.to_binary_event(unwanted)
        status, body, _ = await post(http, url, unwanted_message.body, unwanted_message.headers)
        assert (status, body) == (202, {"accepted": ["http-unwanted"]})  # never 404

        bad_data = sdk_http.to_binary_event(drift_event("http-bad"))
        status, body, _ = await post(http, url, b'{"model_id": 7}', bad_data.headers)
        assert (status, body["code"]) == (400, "data.schema_mismatch")
        assert "http-bad" in body["reason"] or body["reason"]
        status, body, _ = await post(
            http, url, b"{not json", {"Content-Type": "application/cloudevents+json"}
        )
        assert (status, body["code"]) == (400, "structured.invalid_json")
        status, body, _ = await post(http, url, b"hello", {"Content-Type": "text/plain"})
        assert (status, body["code"]) == (400, "record.not_cloudevent")

        address = non_loopback_address()
        if address is not None:  # no credential configured: only loopback may send
            status, body, _ = await post(
                http, f"http://{address}:{worker.web.port}", binary.body, binary.headers
            )
            assert (status, body["code"]) == (403, "forbidden")

        async def decided() -> bool:
            ids = await audited_event_ids(kafka_bootstrap, topics["audit"])
            # stage 1 may still hold the unwanted record when the four decisions are out
            stats = worker.intake.stats
            wanted = {"http-binary", "http-structured", "http-batch-1", "http-batch-2"}
            return wanted <= ids and stats.unrouted == 1

        await wait_for(decided, what="decisions on the audit topic", timeout=60, interval=0.2)
        # Four records were written (the batch is one); none of the refused ones.
        assert worker.intake.stats.received == 4
        assert worker.intake.stats.unrouted == 1
        assert worker.ingress.rejected == {
            "data.schema_mismatch": 1,
            "structured.invalid_json": 1,
            "record.not_cloudevent": 1,
        }


async def test_without_the_token_a_sender_is_refused_and_an_unacknowledged_write_asks_for_a_retry(
    kafka_bootstrap: str, topics: dict[str, str], rules: Path
) -> None:
    token = "s3cret-" + uuid.uuid4().hex
    # A broker that cannot acknowledge within a microsecond stands for a slow or absent one.
    async with (
        running_worker(
            kafka_bootstrap, topics, rules, ingress_token=token, ingress_ack_timeout=1e-6
        ) as (worker, _),
        aiohttp.ClientSession() as http,
    ):
        assert worker.web is not None
        url = worker.web.url
        message = sdk_http.to_binary_event(drift_event("http-auth"))
        status, body, headers = await post(http, url, message.body, message.headers)
        assert (status, body["code"]) == (401, "unauthorized")
        assert headers["WWW-Authenticate"].startswith("Bearer")
        wrong = {**message.headers, "Authorization": "Bearer not-the-token"}
        assert (await post(http, url, message.body, wrong))[0] == 401

        right = {**message.headers, "Authorization": f"Bearer {token}"}
        status, body, headers = await post(http, url, message.body, right)
        assert (status, body["code"]) == (503, "unavailable")
        assert int(headers["Retry-After"]) > 0


class HangingBackend(InMemoryBackend):
    """A backend whose launch does not return until released, as a wedged API call."""

    def __init__(self, clock: SystemClock) -> None:
        super().__init__(clock)
        self.released = asyncio.Event()
        self.hanging = 0

    async def launch(self, request: TrainingRequest) -> JobRef:
        self.hanging += 1
        await self.released.wait()
        return await super().launch(request)


async def test_healthz_fails_when_the_consumer_commits_nothing_while_records_wait(
    kafka_bootstrap: str, topics: dict[str, str], rules: Path
) -> None:
    backend = HangingBackend(SystemClock())
    async with (
        running_worker(
            kafka_bootstrap, topics, rules, backend=backend, health_progress_stall=2.0
        ) as (worker, _),
        aiohttp.ClientSession() as http,
    ):
        assert worker.web is not None
        url = worker.web.url

        async def healthz() -> tuple[int, Any]:
            async with http.get(f"{url}/healthz") as response:
                return response.status, await response.json()

        assert (await healthz())[0] == 200
        async with http.post(f"{url}/events", **binary_request("stuck-1")) as response:
            assert response.status == 202
        await asyncio.sleep(1)
        assert (await healthz())[0] == 200  # one event, processed: nothing waits
        async with http.post(f"{url}/events", **binary_request("stuck-2")) as response:
            assert response.status == 202  # the launch hangs on this one; the next one waits
        async with http.post(f"{url}/events", **binary_request("stuck-3")) as response:
            assert response.status == 202

        async def stuck() -> bool:
            return (await healthz())[0] == 503

        try:
            await wait_for(stuck, what="/healthz to fail", timeout=30, interval=0.2)
            status, body = await healthz()
            assert status == 503
            assert "consumer committed nothing" in body["problems"][0]
            assert backend.hanging == 1
        finally:
            backend.released.set()  # so that the worker can stop


def binary_request(event_id: str) -> dict[str, Any]:
    message = sdk_http.to_binary_event(drift_event(event_id))
    return {"data": message.body, "headers": message.headers}


def write_certificates(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it,
    as PEM files in *directory*."""
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tuneloop test CA")])

    def issue(subject: str, key: Any, *, ca: bool = False, ip: str | None = None) -> Any:
        builder = (
            x509.CertificateBuilder()
            .subject_name(
                ca_name if ca else x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
            )
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ip is not None:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
                critical=False,
            )
        return builder.sign(ca_key, hashes.SHA256())

    def write(name: str, certificate: Any, key: Any) -> None:
        (directory / f"{name}.crt").write_bytes(certificate.public_bytes(Encoding.PEM))
        (directory / f"{name}.key").write_bytes(
            key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        )

    write("ca", issue("ca", ca_key, ca=True), ca_key)
    server_key, client_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    write("server", issue("127.0.0.1", server_key, ip="127.0.0.1"), server_key)
    write("client", issue("knative-broker", client_key), client_key)
    return {name: directory / name for name in ("ca", "server", "client")}


async def test_under_mtls_a_client_certificate_is_the_credential_and_probes_need_none(
    kafka_bootstrap: str, topics: dict[str, str], rules: Path, tmp_path: Path
) -> None:
    pem = write_certificates(tmp_path)
    async with running_worker(
        kafka_bootstrap,
        topics,
        rules,
        web_tls_cert_file=str(pem["server"].with_suffix(".crt")),
        web_tls_key_file=str(pem["server"].with_suffix(".key")),
        web_tls_client_ca_file=str(pem["ca"].with_suffix(".crt")),
    ) as (worker, _):
        assert worker.web is not None
        url = worker.web.url
        assert url.startswith("https://")
        anonymous = ssl.create_default_context(cafile=str(pem["ca"].with_suffix(".crt")))
        with_certificate = ssl.create_default_context(cafile=str(pem["ca"].with_suffix(".crt")))
        with_certificate.load_cert_chain(
            pem["client"].with_suffix(".crt"), pem["client"].with_suffix(".key")
        )
        request = binary_request("mtls-1")
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=anonymous)) as http:
            async with http.get(f"{url}/healthz") as response:
                assert response.status == 200  # the kubelet presents no certificate
            async with http.post(f"{url}/events", **request) as response:
                assert response.status == 401
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=with_certificate)) as http,
            http.post(f"{url}/events", **request) as response,
        ):
            assert response.status == 202
