"""Breaking a client's connection off on purpose, and saying so once instead of as an error."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from rollcap._proxy.relay import (
    TURN_BYTES,
    BreakOffMiddleware,
    StreamResponse,
    UpstreamBroke,
    upstream_broke,
)


def test_upstream_broke_looks_inside_exception_groups() -> None:
    assert upstream_broke(UpstreamBroke("cut"))
    assert upstream_broke(
        BaseExceptionGroup("g", [ValueError(), ExceptionGroup("h", [UpstreamBroke()])])
    )
    assert not upstream_broke(ValueError("a bug"))
    assert not upstream_broke(ExceptionGroup("g", [ValueError()]))


async def test_the_middleware_leaves_the_response_unfinished_and_logs_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sent: list[Any] = []

    async def broken(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise UpstreamBroke("cut")

    async def failing(scope: Any, receive: Any, send: Any) -> None:
        raise ValueError("a bug")

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.disconnect"}

    log = logging.getLogger("rollcap.test")
    scope = {"type": "http", "method": "POST", "path": "/v1/responses"}
    with caplog.at_level(logging.WARNING, logger="rollcap.test"):
        await BreakOffMiddleware(broken, log)(scope, receive, send)
    assert [m["type"] for m in sent] == ["http.response.start"]  # no clean end follows
    assert [r.getMessage() for r in caplog.records] == [
        "POST /v1/responses: upstream broke off its answer; the client's connection is closed "
        "the same way"
    ]
    with pytest.raises(ValueError, match="a bug"):  # anything else is still an error
        await BreakOffMiddleware(failing, log)(scope, receive, send)


async def test_a_client_that_leaves_stops_the_relay_where_it_waits() -> None:
    # Upstream says nothing more; the client leaves: the relay stops at once (its upstream
    # released, here the generator closed), not at upstream's next byte or its read timeout.
    closed = asyncio.Event()
    upstream_silent = asyncio.Event()

    async def chunks() -> AsyncGenerator[bytes, None]:
        try:
            yield b"data: 1\n\n"
            await asyncio.Event().wait()  # forever
            yield b"never"
        finally:
            closed.set()

    sent: list[Any] = []
    left = asyncio.Event()

    async def send(message: Any) -> None:
        sent.append(message)
        if message.get("body") == b"data: 1\n\n":
            upstream_silent.set()

    async def receive() -> Any:
        await left.wait()
        return {"type": "http.disconnect"}

    response = StreamResponse(chunks(), 200, {"content-type": "text/event-stream"})
    relaying = asyncio.ensure_future(response({"type": "http"}, receive, send))
    await asyncio.wait_for(upstream_silent.wait(), 10)
    left.set()
    await asyncio.wait_for(relaying, 10)  # returned, not raised: unfinished on purpose
    assert closed.is_set()
    assert [m.get("more_body") for m in sent[1:]] == [True]  # no clean end follows


async def test_a_cancel_from_elsewhere_still_cancels() -> None:
    async def chunks() -> AsyncGenerator[bytes, None]:
        await asyncio.Event().wait()
        yield b""

    async def send(message: Any) -> None:
        pass

    async def receive() -> Any:
        await asyncio.Event().wait()

    response = StreamResponse(chunks(), 200, {})
    task = asyncio.ensure_future(response({"type": "http"}, receive, send))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_big_chunk_goes_out_in_slices_a_loop_turn_apart() -> None:
    big = bytes(range(256)) * (3 * TURN_BYTES // 256 + 7)

    async def chunks() -> AsyncGenerator[bytes, None]:
        yield big
        yield b"small"

    bodies: list[bytes] = []

    async def send(message: Any) -> None:
        if message["type"] == "http.response.body":
            bodies.append(message["body"])

    async def receive() -> Any:
        await asyncio.Event().wait()

    await StreamResponse(chunks(), 200, {})({"type": "http"}, receive, send)
    assert b"".join(bodies) == big + b"small"
    assert max(map(len, bodies)) == TURN_BYTES
    assert bodies[-2:] == [b"small", b""]
