"""Requests start a few per turn of the loop, in arrival order; a health check never waits."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import MutableMapping
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from rollcap._runtime.pacing import DEFAULT_PER_TURN, Pacer, paced
from rollcap._runtime.serving import serving_in_thread


async def _turns(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def test_at_most_per_turn_start_in_a_turn_and_the_rest_in_order() -> None:
    pacer = Pacer(per_turn=2)
    started: list[int] = []

    async def request(n: int) -> None:
        await pacer.admit()
        started.append(n)

    tasks = [asyncio.create_task(request(n)) for n in range(7)]
    await _turns(1)
    assert started == [0, 1]
    assert pacer.waiting == 5
    await _turns(2)
    assert started == [0, 1, 2, 3]
    await asyncio.gather(*tasks)
    assert started == list(range(7))
    assert pacer.waiting == 0


async def test_a_request_alone_starts_at_once() -> None:
    pacer = Pacer(per_turn=1)
    await pacer.admit()  # no turn of the loop passes: nothing else is waiting
    await _turns(3)
    await pacer.admit()


async def test_a_cancelled_waiter_gives_its_place_to_the_next() -> None:
    pacer = Pacer(per_turn=1)
    started: list[int] = []

    async def request(n: int) -> None:
        await pacer.admit()
        started.append(n)

    first, second, third = (asyncio.create_task(request(n)) for n in range(3))
    await _turns(1)
    assert started == [0]
    second.cancel()
    await asyncio.gather(first, third, return_exceptions=True)
    assert second.cancelled()
    assert started == [0, 2]


def test_per_turn_must_be_positive() -> None:
    with pytest.raises(ValueError, match="per_turn must be at least 1, got 0"):
        Pacer(0)


async def test_health_and_lifespan_pass_while_requests_wait() -> None:
    seen: list[str] = []

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope.get("path", scope["type"]))

    wrapped = paced(app, per_turn=1)

    async def noop(*args: Any) -> Any:
        return None

    calls = [
        wrapped({"type": "http", "path": "/v1/a"}, noop, noop),
        wrapped({"type": "http", "path": "/v1/b"}, noop, noop),
        wrapped({"type": "http", "path": "/v1/c"}, noop, noop),
        wrapped({"type": "http", "path": "/health"}, noop, noop),
        wrapped({"type": "lifespan"}, noop, noop),
    ]
    tasks = [asyncio.ensure_future(call) for call in calls]
    await _turns(1)
    assert seen == ["/v1/a", "/health", "lifespan"]
    await asyncio.gather(*tasks)
    assert seen == ["/v1/a", "/health", "lifespan", "/v1/b", "/v1/c"]


def _request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n".encode()


def test_a_health_check_behind_a_burst_is_answered_before_the_burst_has_started() -> None:
    # Each request of the burst holds the loop a moment as it starts, as setting up a proxied
    # call does; the health check arrives last, over a real socket.
    order: list[str] = []

    async def work(request: Request) -> PlainTextResponse:
        time.sleep(0.002)
        order.append("work")
        return PlainTextResponse("done")

    async def health(request: Request) -> PlainTextResponse:
        order.append("health")
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/work", work), Route("/health", health)])
    burst = 60
    with serving_in_thread(app) as url:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        clients = [socket.create_connection((host, int(port)), timeout=30) for _ in range(burst)]
        checker = socket.create_connection((host, int(port)), timeout=30)
        for client in clients:
            client.sendall(_request("/work"))
        checker.sendall(_request("/health"))
        for sock in (*clients, checker):
            with sock:
                assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    assert order.count("work") == burst
    # Without pacing the whole burst starts in the turn the health check's request is read in,
    # ahead of it.
    assert order.index("health") < burst // 2, order.index("health")
    assert burst // 4 > DEFAULT_PER_TURN
