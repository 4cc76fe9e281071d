"""The pooled async client (`runtimes/kubernetes/async_api.py`) on the real API server.

The backend creates, reads and deletes TrainJobs through one aiohttp session; these tests hold
it to what the synchronous kubernetes client did: the same refusals with the same messages
(the synchronous client, an independent implementation, is the oracle), a `429` with its
`Retry-After`, a ServiceAccount's bearer token with its prefix and refresh hook, the TLS
settings of the `Configuration`, and a session that outlives its loop or an `aclose`.

The `429` comes from the real API server: the local control plane runs API Priority and
Fairness off, so an admission webhook of the test's (a stand-in for a busy admission
controller, served on 127.0.0.1 like the Trainer's own) denies the create with code 429 and
`retryAfterSeconds`, which the API server turns into its answer and `Retry-After` header.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import json
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devservices.kubernetes import KubeEndpoint, make_certificates
from orchestrator.clock import SystemClock
from orchestrator.errors import JobRejectedError, TransientBackendError
from runtimes.kubernetes import manifests
from runtimes.kubernetes.async_api import (
    AsyncCustomObjects,
    Collection,
    CustomObjects,
    ThreadedCustomObjects,
)
from runtimes.kubernetes.backend import BackendSettings, KubernetesBackend
from runtimes.kubernetes.catalog import GROUP, VERSION, RuntimeCatalog
from runtimes.kubernetes.errors import translate
from tests.contract.backend_contract import request

pytestmark = pytest.mark.kubernetes

RUNTIME = "torch-distributed"


@pytest.fixture
def admin(kube_api: KubeEndpoint) -> Iterator[Any]:
    with kube_api.api_client() as api:
        yield api


@pytest.fixture
def objects(admin: Any) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(admin)


def collection(namespace: str) -> Collection:
    return Collection(GROUP, VERSION, namespace, manifests.PLURAL)


def trainjob(name: str, *, runtime: str = RUNTIME, nodes: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": manifests.API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": runtime}, "trainer": {"numNodes": nodes}},
    }


async def refusal(call: Awaitable[Any]) -> ApiException:
    with pytest.raises(ApiException) as caught:
        await call
    return caught.value


def status_of(error: ApiException) -> tuple[int | None, str, str]:
    body = json.loads(error.body or "{}")
    return error.status, body.get("reason", ""), body.get("message", "")


async def test_the_async_and_the_synchronous_client_are_refused_alike(
    admin: Any, objects: client.CustomObjectsApi, k8s_namespace: str
) -> None:
    ours = AsyncCustomObjects(admin, collection(k8s_namespace), timeout=10.0)
    oracle = ThreadedCustomObjects(objects, collection(k8s_namespace), timeout=10.0)
    refusals: list[tuple[int, str, Callable[[CustomObjects], Awaitable[Any]]]] = [
        (409, "AlreadyExists", lambda objects: objects.create(trainjob("ft-twice"))),
        (404, "NotFound", lambda objects: objects.get("ft-missing")),
        (422, "Invalid", lambda objects: objects.create(trainjob("FT-Not-A-DNS-Name"))),
        (
            404,
            "NotFound",
            lambda objects: objects.delete("ft-missing", propagation_policy="Background"),
        ),
    ]
    try:
        await ours.create(trainjob("ft-twice"))
        for status, reason, call in refusals:
            mine, theirs = await refusal(call(ours)), await refusal(call(oracle))
            assert status_of(mine)[:2] == (status, reason)
            assert status_of(mine) == status_of(theirs)
            assert str(translate(mine, doing="x")) == str(translate(theirs, doing="x"))
    finally:
        await ours.aclose()


def version_of(obj: Any) -> str:
    return str(obj["metadata"]["resourceVersion"])


async def test_what_it_creates_reads_back_and_deletes(
    admin: Any, objects: client.CustomObjectsApi, k8s_namespace: str
) -> None:
    ours = AsyncCustomObjects(admin, collection(k8s_namespace), timeout=10.0)
    try:
        await ours.create(trainjob("ft-round-trip", nodes=2))
        # The real Trainer controller writes the job's status meanwhile: the two reads are
        # compared at one resourceVersion (under load a write once fell between them).
        for _ in range(20):
            stored = await ours.get("ft-round-trip")
            oracle = objects.get_namespaced_custom_object(
                GROUP, VERSION, k8s_namespace, manifests.PLURAL, "ft-round-trip"
            )
            if version_of(stored) == version_of(oracle):
                break
        assert stored["spec"]["trainer"]["numNodes"] == 2
        assert stored == oracle
        await ours.delete("ft-round-trip", propagation_policy="Background")
    finally:
        await ours.aclose()
    with pytest.raises(ApiException) as gone:
        objects.get_namespaced_custom_object(
            GROUP, VERSION, k8s_namespace, manifests.PLURAL, "ft-round-trip"
        )
    assert gone.value.status == 404


# --- a 429 with Retry-After, from the API server --------------------------------------------


BUSY_MESSAGE = "the admission queue is full"
RETRY_AFTER_SECONDS = 7


@pytest.fixture
async def busy_admission(
    kube_api: KubeEndpoint, admin: Any, k8s_namespace: str, tmp_path: Path
) -> AsyncIterator[list[str]]:
    """A validating webhook on TrainJob creates in the test's namespace that denies each with
    code 429 and `retryAfterSeconds` (a stand-in for a busy admission controller); yields the
    names it was asked about."""
    if kube_api.server is None:
        pytest.skip("an external API server cannot call a webhook on this machine")
    certificates = make_certificates(
        tmp_path / "webhook", now=datetime.datetime.now(datetime.UTC), days=1
    )
    asked: list[str] = []

    async def review(http_request: web.Request) -> web.Response:
        document = await http_request.json()
        asked.append(document["request"]["name"])
        return web.json_response(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": document["request"]["uid"],
                    "allowed": False,
                    "status": {
                        "code": 429,
                        "reason": "TooManyRequests",
                        "message": BUSY_MESSAGE,
                        "details": {"retryAfterSeconds": RETRY_AFTER_SECONDS},
                    },
                },
            }
        )

    server = web.Application()
    server.router.add_post("/validate", review)
    runner = web.AppRunner(server)
    await runner.setup()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(certificates.server_cert, certificates.server_key)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    name = f"busy-{uuid.uuid4().hex[:8]}"
    webhooks = client.AdmissionregistrationV1Api(admin)
    webhooks.create_validating_webhook_configuration(
        {
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "busy.tuneloop.test",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{port}/validate",
                        "caBundle": base64.b64encode(certificates.ca.read_bytes()).decode(),
                    },
                    "rules": [
                        {
                            "apiGroups": [GROUP],
                            "apiVersions": [VERSION],
                            "operations": ["CREATE"],
                            "resources": ["trainjobs"],
                            "scope": "Namespaced",
                        }
                    ],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": k8s_namespace}
                    },
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "failurePolicy": "Ignore",
                    "timeoutSeconds": 5,
                }
            ],
        }
    )
    try:
        yield asked
    finally:
        webhooks.delete_validating_webhook_configuration(name)
        await runner.cleanup()


async def first_refusal(objects: client.CustomObjectsApi, namespace: str) -> ApiException:
    """Dry-run creates (the synchronous client, in a thread: the webhook answers on this loop)
    until the API server has picked up the webhook and refuses one."""
    for attempt in range(100):
        try:
            await asyncio.to_thread(
                objects.create_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                manifests.PLURAL,
                trainjob(f"ft-probe-{attempt}"),
                dry_run="All",
            )
        except ApiException as exc:
            return exc
        await asyncio.sleep(0.1)
    raise AssertionError("the API server never called the webhook")


async def test_a_429_waits_as_long_as_the_api_servers_retry_after(
    busy_admission: list[str],
    objects: client.CustomObjectsApi,
    k8s_namespace: str,
) -> None:
    probe = await first_refusal(objects, k8s_namespace)
    assert probe.status == 429
    assert probe.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
    backend = KubernetesBackend(
        objects,
        clock=SystemClock(),
        settings=BackendSettings(namespace=k8s_namespace, backoff_initial=0.1),
    )
    try:
        with pytest.raises(TransientBackendError) as error:
            await backend.launch(request("ft-busy", RUNTIME))
    finally:
        await backend.aclose()
    assert busy_admission[-1] == "ft-busy"
    assert error.value.delay == float(RETRY_AFTER_SECONDS)
    assert "429" in str(error.value)
    assert BUSY_MESSAGE in str(error.value)


# --- credentials and TLS from the Configuration ---------------------------------------------


def service_account_token(admin: Any, namespace: str) -> str:
    """A token of a new ServiceAccount allowed exactly what a launch does to TrainJobs."""
    core = client.CoreV1Api(admin)
    rbac = client.RbacAuthorizationV1Api(admin)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "launcher"}})
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "launcher"},
            "rules": [
                {"apiGroups": [GROUP], "resources": ["trainjobs"], "verbs": ["create", "get"]}
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "launcher"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "launcher",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "launcher", "namespace": namespace}],
        },
    )
    answer = core.create_namespaced_service_account_token(
        "launcher", namespace, {"spec": {"expirationSeconds": 3600}}
    )
    token: str = answer.status.token
    return token


def bearer_configuration(admin: Any, token: str) -> client.Configuration:
    """The server and CA of *admin*, and *token* as an in-cluster client sets it: no client
    certificate."""
    configuration = client.Configuration(
        host=admin.configuration.host, ssl_ca_cert=admin.configuration.ssl_ca_cert
    )
    configuration.api_key = {"BearerToken": token}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    return configuration


async def launch_with(
    configuration: client.Configuration, objects: client.CustomObjectsApi, namespace: str, name: str
) -> None:
    """Launch *name* on a backend that creates through *configuration*; the runtimes are
    listed beforehand by the admin (*objects*)."""
    catalog = RuntimeCatalog(objects, clock=SystemClock(), namespace=namespace)
    await catalog.runtimes()
    with client.ApiClient(configuration) as api_client:
        backend = KubernetesBackend(
            client.CustomObjectsApi(api_client),
            clock=SystemClock(),
            catalog=catalog,
            settings=BackendSettings(namespace=namespace),
        )
        try:
            await backend.launch(request(name, RUNTIME))
        finally:
            await backend.aclose()


async def test_a_service_account_token_is_sent_with_its_prefix_and_refreshed_by_the_hook(
    admin: Any, objects: client.CustomObjectsApi, k8s_namespace: str
) -> None:
    token = await asyncio.to_thread(service_account_token, admin, k8s_namespace)
    await launch_with(bearer_configuration(admin, token), objects, k8s_namespace, "ft-bearer")

    stale = bearer_configuration(admin, "not-a-token")
    with pytest.raises(JobRejectedError) as refused:
        await launch_with(stale, objects, k8s_namespace, "ft-stale")
    assert refused.value.reason == "Unauthorized"

    refreshed: list[str] = []

    def refresh(configuration: client.Configuration) -> None:
        # As load_incluster_config's hook does once the token file is a minute old.
        configuration.api_key["BearerToken"] = token
        refreshed.append(token)

    stale.refresh_api_key_hook = refresh
    await launch_with(stale, objects, k8s_namespace, "ft-refreshed")
    assert refreshed
    names = {
        item["metadata"]["name"]
        for item in objects.list_namespaced_custom_object(
            GROUP, VERSION, k8s_namespace, manifests.PLURAL
        )["items"]
    }
    assert names == {"ft-bearer", "ft-refreshed"}


async def test_tls_server_name_is_the_name_the_servers_certificate_is_checked_against(
    admin: Any, k8s_namespace: str
) -> None:
    # The local API server's certificate names 127.0.0.1 and localhost, nothing else.
    if not admin.configuration.host.startswith("https://127.0.0.1:"):
        pytest.skip("needs the local control plane's certificate")
    answers: dict[str, Any] = {}
    for server_name in ("localhost", "elsewhere.invalid"):
        configuration = copy.deepcopy(admin.configuration)
        configuration.tls_server_name = server_name
        named = client.ApiClient(configuration)
        ours = AsyncCustomObjects(named, collection(k8s_namespace), timeout=10.0)
        try:
            answers[server_name] = await ours.get("ft-none")
        except Exception as exc:  # the refusal is the answer under test
            answers[server_name] = translate(exc, doing="read")
        finally:
            await ours.aclose()
            named.close()
    assert isinstance(answers["localhost"], JobRejectedError)  # 404: the server answered
    assert answers["localhost"].reason == "NotFound"
    assert isinstance(answers["elsewhere.invalid"], TransientBackendError)
    assert "certificate" in str(answers["elsewhere.invalid"]).lower()


# --- the session and the event loop ---------------------------------------------------------


def test_a_backend_keeps_launching_from_a_new_loop_and_after_aclose(
    objects: client.CustomObjectsApi, k8s_namespace: str
) -> None:
    backend = KubernetesBackend(
        objects, clock=SystemClock(), settings=BackendSettings(namespace=k8s_namespace)
    )

    async def launch(*names: str, close: bool) -> None:
        for name in names:
            await backend.launch(request(name, RUNTIME))
            if close:
                await backend.aclose()

    asyncio.run(launch("ft-loop-one", close=False))  # its session goes with its loop
    asyncio.run(launch("ft-loop-two", "ft-loop-three", close=True))
    names = {
        item["metadata"]["name"]
        for item in objects.list_namespaced_custom_object(
            GROUP, VERSION, k8s_namespace, manifests.PLURAL
        )["items"]
    }
    assert names == {"ft-loop-one", "ft-loop-two", "ft-loop-three"}
