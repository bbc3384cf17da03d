"""Serving on sockets bound up front: a busy port is a clear error, before anything starts."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import aiohttp
import pytest
import uvloop
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from rollcap._runtime.serving import (
    KEEP_ALIVE_S,
    SEND_BUFFER_BYTES,
    bind,
    serving,
    serving_in_thread,
)


async def _hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


APP = Starlette(routes=[Route("/", _hello)])


async def test_serving_yields_the_base_url_of_a_running_server() -> None:
    async with (
        serving(APP) as url,
        aiohttp.ClientSession() as session,
        session.get(url + "/") as response,
    ):
        assert await response.text() == "hello"


def test_a_busy_port_names_the_address() -> None:
    with bind("127.0.0.1", 0) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            bind("127.0.0.1", port)


def test_serving_in_a_thread_for_synchronous_callers() -> None:
    import urllib.request

    with serving_in_thread(APP) as url, urllib.request.urlopen(url + "/", timeout=10) as answer:
        assert answer.read() == b"hello"


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


async def test_a_connection_that_never_finishes_its_headers_is_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with serving(APP, header_timeout_s=0.3) as url:
        trickle = await asyncio.to_thread(_connect, url)
        idle = await asyncio.to_thread(_connect, url)
        polite = await asyncio.to_thread(_connect, url)
        with trickle, idle, polite, caplog.at_level(logging.INFO, "rollcap.serving"):
            await asyncio.to_thread(polite.sendall, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            answer = await asyncio.to_thread(_read_hello, polite)
            assert answer.startswith(b"HTTP/1.1 200")

            def trickle_headers() -> bytes:
                # A byte every 50 ms: never done within the timeout; the server closes.
                for byte in b"GET / HTTP/1.1\r\nhost: x\r\nx-slow: " + b"y" * 200:
                    try:
                        trickle.sendall(bytes([byte]))
                    except OSError:
                        break
                    time.sleep(0.05)
                return trickle.recv(4096)

            assert await asyncio.to_thread(trickle_headers) == b""  # closed, no answer
            assert await asyncio.to_thread(idle.recv, 4096) == b""
            # The polite connection, its headers long done, stays open for its next request.
            await asyncio.to_thread(polite.sendall, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            assert (await asyncio.to_thread(_read_hello, polite)).startswith(b"HTTP/1.1 200")
    closed = [r.getMessage() for r in caplog.records if r.name == "rollcap.serving"]
    assert len(closed) == 2
    assert all("no request headers within 0.3 s" in m for m in closed)


def test_a_burst_of_connections_is_accepted_at_once() -> None:
    # libuv (uvloop: the servers' loop) accepts one connection per loop turn: a burst of 200
    # would take 200 turns (seconds, when streams make each turn long). Each accepted
    # connection takes the others waiting, so the whole burst starts within a few turns.
    turns = 0
    started: list[int] = []

    async def count_turns() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    async def hello(request: Request) -> PlainTextResponse:
        started.append(turns)
        return PlainTextResponse("ok")

    async def burst() -> None:
        app = Starlette(routes=[Route("/", hello)])
        async with serving(app) as url:
            # Connected while the loop is held here: all 200 wait in the kernel's queue.
            clients = [_connect(url) for _ in range(200)]
            ticking = asyncio.ensure_future(count_turns())
            for client in clients:
                client.sendall(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            answers = await asyncio.gather(*(asyncio.to_thread(_read_all, c) for c in clients))
            ticking.cancel()
            assert all(answer.endswith(b"ok") for answer in answers)

    uvloop.run(burst())
    assert max(started) - min(started) < 100  # one accept per turn: 199 turns at least


def _read_hello(client: socket.socket) -> bytes:
    """One answer of the app's, read up to its body."""
    data = b""
    while not data.endswith(b"hello"):
        chunk = client.recv(4096)
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data


def _read_all(client: socket.socket) -> bytes:
    with client:
        data = b""
        while chunk := client.recv(4096):
            data += chunk
        return data


def test_a_listening_socket_bounds_its_connections_send_buffers() -> None:
    with bind("127.0.0.1", 0) as sock:
        size = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    assert size <= 2 * SEND_BUFFER_BYTES  # the kernel doubles what it is asked for


def test_the_keep_alive_outlasts_the_sdk_clients_idle_expiry() -> None:
    # A server that closes an idle connection first races the client's next request on it;
    # the SDKs agents use close theirs after keepalive_expiry, aiohttp after 15 s.
    import anthropic._constants
    import openai._constants

    expiries = [
        openai._constants.DEFAULT_CONNECTION_LIMITS.keepalive_expiry,
        anthropic._constants.DEFAULT_CONNECTION_LIMITS.keepalive_expiry,
        15.0,  # aiohttp.TCPConnector's keepalive_timeout
    ]
    assert all(expiry is not None and expiry < KEEP_ALIVE_S for expiry in expiries)


def test_an_idle_connection_is_still_open_after_the_sdks_would_have_dropped_it() -> None:
    import http.client

    with serving_in_thread(APP) as url:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            connection.request("GET", "/")
            assert connection.getresponse().read() == b"hello"
            first = connection.sock
            time.sleep(5.5)  # past uvicorn's default keep-alive, 5 s
            connection.request("GET", "/")  # on the same socket: a closed one fails here
            assert connection.getresponse().read() == b"hello"
            assert connection.sock is first
        finally:
            connection.close()
