"""The web server stops promptly even while a page holds a long response open.

aiohttp does not cancel a handler whose client went away, and waits for handlers in flight
when it stops; the dashboard's event stream ends only when told to. The server's closing
hooks tell it, before that wait.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web

from handlers.web.server import WebServer


async def test_a_stream_held_open_ends_through_the_closing_hooks_when_the_server_stops() -> None:
    release = asyncio.Event()
    streaming = asyncio.Event()
    routes = web.RouteTableDef()

    @routes.get("/stream")
    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"connected\n")
        streaming.set()
        await release.wait()  # as a page's subscription waits for the next change
        return response

    server = WebServer(host="127.0.0.1", port=0, routes=[routes], on_shutdown=[release.set])
    await server.start()
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{server.url}/stream") as response,
    ):
        assert await response.content.readline() == b"connected\n"
        await asyncio.wait_for(streaming.wait(), 10)
        started = time.monotonic()
        await asyncio.wait_for(server.stop(), 20)
    assert release.is_set()
    assert time.monotonic() - started < 10  # aiohttp alone would wait its 60 s timeout
