"""`AsyncCustomObjects`: create, read and delete namespaced custom objects on one pooled
`aiohttp.ClientSession`, on the event loop (issue 17: no thread per call on the launch path).

`KubernetesBackend` creates, reads (after a `409`, and to cancel), deletes and watches
TrainJobs through it (`custom_objects` picks it); its list, once per (re)start of the watch,
stays on the synchronous client.
Everything it connects with is read from the same `kubernetes.client.ApiClient` the
synchronous client uses, so a kubeconfig, the in-cluster ServiceAccount and the local control
plane work alike:

* `host` (with any path prefix), `ssl_ca_cert` / `ca_cert_data`, `verify_ssl`,
  `assert_hostname` (False: the name is not checked), `cert_file` / `key_file` (client
  certificate), `tls_server_name` (SNI and the name checked);
* the bearer token from `Configuration.auth_settings()` on every request, which calls
  `refresh_api_key_hook` when one is set (in-cluster: the token file is read again once it
  is a minute old; kubeconfig: an expired token is refreshed), on the loop;
* `proxy`, `no_proxy` and `proxy_headers` (an HTTP(S) proxy), the client's `default_headers`
  and `User-Agent`. aiohttp speaks no SOCKS: behind a SOCKS proxy `custom_objects` picks
  `ThreadedCustomObjects`, the synchronous client in a thread per call, as before.

`connection_pool_maxsize`, `retries`, `socket_options` and `keep_alive` are urllib3's: the
session keeps aiohttp's own pool (at most 100 connections, idle ones closed after 15 s) and
sends each request once, where urllib3 tried a refused connection up to 3 times more at once:
the service retries a transient failure after its delay (`orchestrator/service.py`).

Failures are raised as the synchronous client raises them, so `errors.translate` reads both
alike: an HTTP error status as `ApiException` with its status, reason, headers (`Retry-After`)
and body (the API server's `Status`); a connection that fails as `aiohttp.ClientError`; a call
past its timeout as `TimeoutError`.

The session belongs to the loop it was made on: it is made on first use, closed by `aclose`
(the worker closes the backend on shutdown), and made again if a call comes from another loop.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast
from urllib.parse import quote

import aiohttp
from kubernetes.client import ApiClient, CustomObjectsApi, rest
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import should_bypass_proxies
from kubernetes.watch.watch import iter_resp_lines

_response_lines: Callable[[Any], Iterator[str]] = iter_resp_lines
"""The synchronous client's own line splitter for a streamed watch response (typed here)."""


def supports(api_client: ApiClient) -> bool:
    """Whether `AsyncCustomObjects` can talk to *api_client*'s server: not through a SOCKS
    proxy, which aiohttp does not speak (the backend then keeps the synchronous client)."""
    configuration = api_client.configuration
    proxy = configuration.proxy
    return not (
        proxy
        and cast(Any, rest).is_socks_proxy_url(proxy)  # untyped
        and not should_bypass_proxies(configuration.host, configuration.no_proxy or "")
    )


def tls_context(api_client: ApiClient) -> ssl.SSLContext:
    """The TLS settings of *api_client*'s `Configuration`, as the synchronous client applies
    them (`kubernetes/client/rest.py`: urllib3's `cert_reqs`, `ca_certs`, `ca_cert_data`,
    `cert_file`, `key_file`, `assert_hostname`)."""
    configuration = api_client.configuration
    context = ssl.create_default_context(
        cafile=configuration.ssl_ca_cert,
        cadata=getattr(configuration, "ca_cert_data", None),  # newer clients only
    )
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif configuration.assert_hostname is False:
        context.check_hostname = False
    return context


@dataclass(frozen=True, slots=True)
class WatchQuery:
    """What one watch of a collection asks for."""

    label_selector: str
    resource_version: str
    """Events after this version (a list's, or the last event's)."""
    timeout_seconds: int
    """The server ends the watch after this long; silence for 10 s more is a lost line."""
    connect_timeout: float


class CustomObjects(Protocol):
    """Create, read and delete the objects of one namespaced custom resource collection."""

    async def create(self, body: Mapping[str, Any]) -> None:
        """Create *body* (what the server stored is not read: nobody needs it)."""
        ...

    async def get(self, name: str) -> dict[str, Any]:
        """The object *name*."""
        ...

    async def delete(self, name: str, *, propagation_policy: str) -> None:
        """Delete the object *name* (`Background`: its dependents follow)."""
        ...

    def watch(self, query: WatchQuery) -> AsyncGenerator[str | bytes, None]:
        """The lines of the watch *query* asks for, with bookmarks: one JSON watch event
        each, until the server ends the watch. An error status is raised before the first
        line; close the generator to leave early."""
        ...

    async def aclose(self) -> None:
        """Let go of connections; a later call makes new ones."""
        ...


@dataclass(frozen=True, slots=True)
class Collection:
    """A namespaced custom resource collection, e.g. the TrainJobs of one namespace."""

    group: str
    version: str
    namespace: str
    plural: str

    def path(self, name: str = "") -> str:
        """The API path of the collection, or of its object *name*."""
        path = (
            f"/apis/{self.group}/{self.version}/namespaces/{quote(self.namespace, safe='')}"
            f"/{self.plural}"
        )
        return f"{path}/{quote(name, safe='')}" if name else path


class AsyncCustomObjects(CustomObjects):
    """A collection's objects through one pooled aiohttp session (see the module docstring).

    Args:
        api_client: the synchronous client whose `Configuration` (server, TLS, credentials,
            proxy) and headers to use; it is not called.
        collection: which objects.
        timeout: seconds one call may take, connecting included.
    """

    def __init__(self, api_client: ApiClient, collection: Collection, *, timeout: float) -> None:
        configuration = api_client.configuration
        self._configuration = configuration
        self._collection = collection
        self._base = str(configuration.host).rstrip("/")
        self._tls: ssl.SSLContext | bool = (
            tls_context(api_client) if self._base.startswith("https:") else False
        )
        self._headers = {
            **api_client.default_headers,
            "Accept": "application/json",
            "User-Agent": str(api_client.user_agent),
        }
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        bypass = should_bypass_proxies(self._base, configuration.no_proxy or "")
        self._proxy: str | None = None if bypass else configuration.proxy or None
        self._proxy_headers: Mapping[str, str] | None = (
            configuration.proxy_headers if self._proxy else None
        )
        self._server_hostname: str | None = configuration.tls_server_name or None
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def create(self, body: Mapping[str, Any]) -> None:
        data = json.dumps(body, separators=(",", ":")).encode("utf-8")
        await self._request("POST", self._collection.path(), data=data, decode=False)

    async def get(self, name: str) -> dict[str, Any]:
        return await self._request("GET", self._collection.path(name))

    async def delete(self, name: str, *, propagation_policy: str) -> None:
        await self._request(
            "DELETE",
            self._collection.path(name),
            params={"propagationPolicy": propagation_policy},
            decode=False,
        )

    async def watch(self, query: WatchQuery) -> AsyncGenerator[str | bytes, None]:
        params = {
            "watch": "true",
            "labelSelector": query.label_selector,
            "resourceVersion": query.resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(query.timeout_seconds),
        }
        # Not the session's bound on a whole call: a watch lasts as long as the server keeps
        # it open, and only a silence past its own timeout means the connection is gone.
        timeout = aiohttp.ClientTimeout(
            total=None, connect=query.connect_timeout, sock_read=query.timeout_seconds + 10
        )
        session = self._session_here()
        async with session.get(
            self._base + self._collection.path(),
            params=params,
            headers=self._request_headers(with_body=False),
            proxy=self._proxy,
            proxy_headers=self._proxy_headers,
            server_hostname=self._server_hostname,
            timeout=timeout,
        ) as response:
            if not 200 <= response.status < 300:
                raise _api_exception(response, await response.read())
            pending = bytearray()
            async for chunk in response.content.iter_any():
                pending += chunk
                start = 0
                while (end := pending.find(b"\n", start)) >= 0:
                    line = bytes(pending[start:end])
                    start = end + 1
                    if line.strip():
                        yield line
                del pending[:start]
            if pending.strip():
                yield bytes(pending)

    async def aclose(self) -> None:
        session, self._session, self._loop = self._session, None, None
        if session is not None and not session.closed:
            await session.close()

    def _session_here(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            # A session of a loop that has ended cannot be closed from this one; its
            # connections went with that loop.
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(ssl=self._tls),
                trust_env=False,  # the Configuration already resolved the proxy variables
            )
            self._loop = loop
        return self._session

    def _request_headers(self, *, with_body: bool) -> dict[str, str]:
        headers = dict(self._headers)
        if with_body:
            headers["Content-Type"] = "application/json"
        # auth_settings() runs refresh_api_key_hook, so an expiring token is renewed here.
        bearer = self._configuration.auth_settings().get("BearerToken")
        if bearer and bearer.get("in") == "header" and bearer.get("value"):
            headers[bearer["key"]] = bearer["value"]
        return headers

    async def _request(
        self,
        method: str,
        path: str,
        *,
        data: bytes | None = None,
        params: Mapping[str, str] | None = None,
        decode: bool = True,
    ) -> dict[str, Any]:
        """The answer's JSON object (when *decode*: a created or deleted object is not)."""
        session = self._session_here()
        async with session.request(
            method,
            self._base + path,
            data=data,
            params=params,
            headers=self._request_headers(with_body=data is not None),
            proxy=self._proxy,
            proxy_headers=self._proxy_headers,
            server_hostname=self._server_hostname,
        ) as response:
            payload = await response.read()
            if not 200 <= response.status < 300:
                raise _api_exception(response, payload)
        document: dict[str, Any] = json.loads(payload) if decode and payload else {}
        return document


def _api_exception(response: aiohttp.ClientResponse, payload: bytes) -> ApiException:
    """An error answer as the synchronous client raises it."""
    error = ApiException(status=response.status, reason=response.reason)
    error.body = payload.decode("utf-8", errors="replace")
    error.headers = response.headers
    return error


class ThreadedCustomObjects(CustomObjects):
    """A collection's objects through the synchronous `CustomObjectsApi`, each call in a
    thread: for a server behind a SOCKS proxy (see `supports`).

    Args:
        api: the `CustomObjectsApi` to call.
        collection: which objects.
        timeout: seconds one call may take.
    """

    def __init__(self, api: CustomObjectsApi, collection: Collection, *, timeout: float) -> None:
        self._api: Any = api  # its stubs say `object` for what these calls return
        self._collection = collection
        self._timeout = timeout

    async def create(self, body: Mapping[str, Any]) -> None:
        c = self._collection
        await asyncio.to_thread(
            self._api.create_namespaced_custom_object,
            c.group,
            c.version,
            c.namespace,
            c.plural,
            body,
            _request_timeout=self._timeout,
        )

    async def get(self, name: str) -> dict[str, Any]:
        c = self._collection
        found: dict[str, Any] = await asyncio.to_thread(
            self._api.get_namespaced_custom_object,
            c.group,
            c.version,
            c.namespace,
            c.plural,
            name,
            _request_timeout=self._timeout,
        )
        return found

    async def delete(self, name: str, *, propagation_policy: str) -> None:
        c = self._collection
        await asyncio.to_thread(
            self._api.delete_namespaced_custom_object,
            c.group,
            c.version,
            c.namespace,
            c.plural,
            name,
            propagation_policy=propagation_policy,
            _request_timeout=self._timeout,
        )

    async def watch(self, query: WatchQuery) -> AsyncGenerator[str | bytes, None]:
        c = self._collection
        response: Any = await asyncio.to_thread(
            self._api.list_namespaced_custom_object,
            c.group,
            c.version,
            c.namespace,
            c.plural,
            label_selector=query.label_selector,
            watch=True,
            resource_version=query.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=query.timeout_seconds,
            _preload_content=False,
            _request_timeout=(query.connect_timeout, query.timeout_seconds + 10),
        )
        lines = _response_lines(response)
        try:
            while (line := await asyncio.to_thread(next, lines, None)) is not None:
                yield line
        finally:
            # Close, not just release: a watch left early still has chunks in flight, and a
            # pooled connection with unread bytes makes the next request on the same client
            # fail with BadStatusLine (seen when the orchestrator stopped mid-job).
            response.close()
            response.release_conn()

    async def aclose(self) -> None:
        """Nothing: the `ApiClient` is its owner's to close."""


def custom_objects(
    api: CustomObjectsApi, collection: Collection, *, timeout: float
) -> CustomObjects:
    """*collection*'s objects on *api*'s connection settings: `AsyncCustomObjects`, unless
    its server is behind a SOCKS proxy (`ThreadedCustomObjects` then)."""
    if supports(api.api_client):
        return AsyncCustomObjects(api.api_client, collection, timeout=timeout)
    return ThreadedCustomObjects(api, collection, timeout=timeout)
