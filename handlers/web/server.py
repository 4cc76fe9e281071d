"""The worker's one HTTP server: aiohttp, on the worker's own event loop.

The composition root (`handlers/app.py`) builds it from `WorkerSettings` (port, bind
address, TLS) and the route tables of the modules that serve something (`handlers/web/*`,
the dashboard), and adds it to the faust App as a dependency, so that it starts and stops
with the App.

Why not faust's own web server: faust starts the server registered with `App.web_server`
(and its legacy `faust.web` stack) only after table recovery. A liveness probe must answer
while a worker recovers a large changelog, and `/readyz` exists to say "not yet" during
exactly that time; a server that is not there reads as dead to the kubelet. So faust's
web stays disabled (`web_enabled: False` in `handlers/faust_app.py`) and this is the one
server. It is a dependency added before the App starts, so it starts first.

Adding routes: pass another `aiohttp.web.RouteTableDef` in `routes`; each module that
serves pages exposes a function returning its table (e.g. `health.routes(...)`).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Sequence
from typing import Any

import structlog
from aiohttp import web
from mode import Service

from orchestrator.settings import WorkerSettings

log = structlog.get_logger("tuneloop.web")


class WebServer(Service):
    """Serves *routes* on *host*:*port* while it runs (a `mode.Service`, as faust's parts)."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        routes: Sequence[web.RouteTableDef],
        ssl_context: ssl.SSLContext | None = None,
        on_shutdown: Sequence[Callable[[], None]] = (),
        **kwargs: Any,
    ) -> None:
        self.host = host
        self.requested_port = port
        self.routes = tuple(routes)
        self.closing_hooks = tuple(on_shutdown)
        """Called as the server stops, before it waits for the requests in flight: they end
        long-lived responses (the dashboard's event streams), which aiohttp would otherwise
        wait for until its shutdown timeout, since it does not cancel a handler whose client
        went away."""
        self.ssl_context = ssl_context
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        super().__init__(**kwargs)

    @property
    def port(self) -> int:
        """The port it listens on (the one picked by the system when asked for 0)."""
        if self._port is None:
            raise RuntimeError("the web server is not started")
        return self._port

    @property
    def url(self) -> str:
        """Its base URL, e.g. `http://127.0.0.1:8080`."""
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    async def on_start(self) -> None:
        application = web.Application(client_max_size=_MAX_REQUEST_BYTES)
        for table in self.routes:
            application.add_routes(table)
        application.on_shutdown.append(self._end_long_responses)
        # access_log=None: one line per probe every few seconds would drown the worker's log.
        self._runner = web.AppRunner(application, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.host, self.requested_port, ssl_context=self.ssl_context
        )
        await site.start()
        sockets = getattr(site._server, "sockets", None) or ()  # aiohttp has no public getter
        self._port = int(sockets[0].getsockname()[1]) if sockets else self.requested_port
        log.info("web_server_started", url=self.url)

    async def _end_long_responses(self, _application: web.Application) -> None:
        for end in self.closing_hooks:
            end()

    async def on_stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


_MAX_REQUEST_BYTES = 4 * 1024 * 1024
"""Largest request body aiohttp reads (a batch of events); the ingress checks each event
against `TUNELOOP_KAFKA_MAX_EVENT_BYTES` itself."""


def server_tls(settings: WorkerSettings) -> ssl.SSLContext | None:
    """The server's TLS context: none for plain HTTP; with a client CA, client certificates
    are asked for but optional at the handshake, so that probes need none, and the ingress
    refuses a request without one (`handlers/web/ingress.py`)."""
    if settings.web_tls_cert_file is None or settings.web_tls_key_file is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.web_tls_cert_file, settings.web_tls_key_file)
    if settings.web_tls_client_ca_file is not None:
        context.load_verify_locations(settings.web_tls_client_ca_file)
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def web_server(
    settings: WorkerSettings,
    routes: Sequence[web.RouteTableDef],
    *,
    on_shutdown: Sequence[Callable[[], None]] = (),
) -> WebServer | None:
    """The server *settings* ask for (none without `web_port`), serving *routes*, calling
    *on_shutdown* as it stops (`WebServer.closing_hooks`)."""
    if settings.web_port is None:
        return None
    return WebServer(
        host=settings.web_bind,
        port=settings.web_port,
        routes=routes,
        ssl_context=server_tls(settings),
        on_shutdown=on_shutdown,
    )
