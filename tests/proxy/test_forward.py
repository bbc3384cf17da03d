"""The forwarder over real sockets: the one failure map, and answers upstream breaks off."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from rollcap._proxy.forward import (
    UPSTREAM_KEEP_ALIVE_S,
    UpstreamFailure,
    forwarding_session,
    open_upstream,
    pass_through,
    read_whole,
    upstream_failures,
)
from rollcap._proxy.relay import UpstreamBroke
from rollcap.records import ErrorCategory

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: 100\r\n\r\n"


@pytest.mark.parametrize(
    ("error", "answering", "status", "kind", "category", "text"),
    [
        (TimeoutError(), False, 504, "timeout", ErrorCategory.TIMEOUT, "did not answer in time"),
        (
            TimeoutError(),
            True,
            504,
            "timeout",
            ErrorCategory.TIMEOUT,
            "went silent before the end of its answer",
        ),
        (
            aiohttp.ClientConnectionError("refused"),
            False,
            502,
            "api_connection_error",
            ErrorCategory.CONNECTION,
            "unreachable: refused",
        ),
        (
            aiohttp.ClientPayloadError("cut"),
            True,
            502,
            "api_error",
            None,
            "broke off its answer: cut",
        ),
    ],
)
def test_the_failure_map(
    error: Exception,
    answering: bool,
    status: int,
    kind: str,
    category: ErrorCategory | None,
    text: str,
) -> None:
    with pytest.raises(UpstreamFailure) as caught, upstream_failures(answering=answering):
        raise error
    failure = caught.value
    assert (failure.status, failure.kind, failure.category) == (status, kind, category)
    assert str(failure) == f"upstream {text}"
    assert failure.timed_out is (category is ErrorCategory.TIMEOUT)
    assert failure.__cause__ is error


def test_other_errors_are_not_mapped() -> None:
    with pytest.raises(ValueError, match="a bug"), upstream_failures():
        raise ValueError("a bug")


@contextlib.asynccontextmanager
async def _upstream(answer: bytes, *, then_close: bool) -> AsyncIterator[str]:
    """A server that sends ``answer`` to each request, then closes or goes silent."""

    handlers: set[asyncio.Task[Any]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
            if not then_close:
                await asyncio.sleep(30)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1/chat/completions"
    finally:
        server.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


class _Observer:
    def __init__(self) -> None:
        self.chunks: list[int] = []
        self.failed: list[ErrorCategory] = []

    def upstream_bytes(self, mono: float, size: int) -> None:
        self.chunks.append(size)

    def upstream_failed(self, category: ErrorCategory) -> None:
        self.failed.append(category)


async def _serve(response: Any) -> tuple[list[dict[str, Any]], BaseException | None]:
    """Run an ASGI response; the messages it sent, and what it raised."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(30)
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    try:
        await response({"type": "http"}, receive, send)
    except Exception as exc:
        return sent, exc
    return sent, None


@pytest.mark.parametrize("then_close", [True, False], ids=["cut", "silent"])
async def test_a_body_upstream_breaks_off_reaches_the_client_as_it_came(then_close: bool) -> None:
    answer = HEAD % b"application/json" + b'{"partial'
    async with (
        _upstream(answer, then_close=then_close) as url,
        forwarding_session(connect_timeout_s=5, read_timeout_s=0.3) as session,
    ):
        observer = _Observer()
        upstream = await open_upstream(session, "POST", url, b"{}", [])
        sent, raised = await _serve(await pass_through(upstream, observer))
    start, body = sent
    assert start["status"] == 200
    assert (b"content-length", b"100") in start["headers"]
    assert (body["body"], body["more_body"]) == (b'{"partial', True)
    assert isinstance(raised, UpstreamBroke)  # the client's connection breaks as upstream's did
    assert observer.chunks == [len(b'{"partial')]  # told of every byte that came
    assert observer.failed == ([] if then_close else [ErrorCategory.TIMEOUT])


@pytest.mark.parametrize("then_close", [True, False], ids=["cut", "silent"])
async def test_a_stream_upstream_breaks_off_breaks_the_same_way(then_close: bool) -> None:
    answer = HEAD % b"text/event-stream" + b"data: {}\n\n"
    async with (
        _upstream(answer, then_close=then_close) as url,
        forwarding_session(connect_timeout_s=5, read_timeout_s=0.3) as session,
    ):
        observer = _Observer()
        upstream = await open_upstream(session, "POST", url, b"{}", [])
        sent, raised = await _serve(await pass_through(upstream, observer))
    assert [m.get("body") for m in sent] == [None, b"data: {}\n\n"]
    assert isinstance(raised, UpstreamBroke)
    assert observer.failed == ([] if then_close else [ErrorCategory.TIMEOUT])


async def test_read_whole_maps_a_cut_body() -> None:
    async with (
        _upstream(HEAD % b"application/json" + b"{}", then_close=True) as url,
        forwarding_session(connect_timeout_s=5, read_timeout_s=5) as session,
    ):
        upstream = await open_upstream(session, "POST", url, b"{}", [])
        with pytest.raises(UpstreamFailure, match="broke off its answer") as caught:
            await read_whole(upstream)
    assert (caught.value.status, caught.value.category) == (502, None)


async def test_no_answer_at_all() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with forwarding_session(connect_timeout_s=5, read_timeout_s=0.3) as session:
        with pytest.raises(UpstreamFailure) as refused:
            await open_upstream(session, "POST", f"http://127.0.0.1:{port}/", b"{}", [])
        async with _upstream(b"", then_close=False) as url:
            with pytest.raises(UpstreamFailure) as silent:
                await open_upstream(session, "POST", url, b"{}", [])
    assert (refused.value.status, refused.value.category) == (502, ErrorCategory.CONNECTION)
    assert (silent.value.status, silent.value.category) == (504, ErrorCategory.TIMEOUT)


async def test_an_idle_upstream_connection_is_closed_before_uvicorns_keep_alive_ends() -> None:
    # vLLM is served by uvicorn, which closes a connection idle for its timeout_keep_alive; the
    # forwarder must never send a call on a connection the upstream may be closing.
    import uvicorn

    assert uvicorn.Config(app="unused:app").timeout_keep_alive > UPSTREAM_KEEP_ALIVE_S
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, forwarding_session(connect_timeout_s=5, read_timeout_s=5) as session:
        for pause in (0.0, 0.2, UPSTREAM_KEEP_ALIVE_S + 0.5):
            await asyncio.sleep(pause)
            async with session.get(f"http://127.0.0.1:{port}/") as answer:
                assert await answer.read() == b"ok"
    # The first connection served the first two calls; the third, after a longer pause, a new one.
    assert len(connections) == 2
