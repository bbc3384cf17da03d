"""Relaying an upstream's stream to a client, for the servers that forward (model server,
capture worker): chunk by chunk, stopping when the client leaves, and breaking the client's
connection the way upstream broke its own.

Starlette's StreamingResponse watches for the disconnect with a task group per response; one
plain task does the same job with less work before the first chunk. A client that leaves stops
the relay at once, wherever it waits (on upstream, or on a client that reads nothing): the
response's task is cancelled, which releases (closes) the upstream connection, and the response
ends unfinished.

When upstream breaks its answer off, the app raises ``UpstreamBroke``; ``break_off_on`` turns
that into returning with the response unfinished, which makes the HTTP server drop the client's
connection: what the client would have seen from upstream directly, and never a clean end an
SDK could take for a finished answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from contextvars import ContextVar

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = [
    "TURN_BYTES",
    "BreakOffMiddleware",
    "StreamResponse",
    "UpstreamBroke",
    "break_off_on",
    "quiet_deliberate_breaks",
    "upstream_broke",
]


# The most a stream relays per turn of the event loop.
TURN_BYTES = 16 * 1024


class UpstreamBroke(Exception):
    """Upstream broke its answer off; the client's connection is to be broken off too."""


def upstream_broke(exc: BaseException) -> bool:
    if isinstance(exc, UpstreamBroke):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(upstream_broke(inner) for inner in exc.exceptions)
    return False


# Set in the request's task when a response is left unfinished on purpose.
_BROKE_OFF: ContextVar[bool] = ContextVar("rollcap_broke_off", default=False)
_UNFINISHED = "ASGI callable returned without completing response."


class _DeliberatelyUnfinished(logging.Filter):
    """uvicorn reports every response an app leaves unfinished as an error. The ones left
    unfinished on purpose are logged once, as what happened, instead. uvicorn logs from the
    request's own task, so the flag set there is what it sees."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_BROKE_OFF.get() and record.msg == _UNFINISHED)


_FILTER = _DeliberatelyUnfinished()


def quiet_deliberate_breaks() -> None:
    """Keep uvicorn from reporting as errors the responses left unfinished on purpose."""
    logging.getLogger("uvicorn.error").addFilter(_FILTER)  # a filter is added once only


async def break_off_on(
    app: ASGIApp, scope: Scope, receive: Receive, send: Send, log: logging.Logger
) -> None:
    """Run ``app``; an ``UpstreamBroke`` leaves the response unfinished and logs one warning.

    Call ``quiet_deliberate_breaks()`` once when the server is built.
    """
    try:
        await app(scope, receive, send)
    except BaseException as exc:
        if not upstream_broke(exc):
            raise
        _BROKE_OFF.set(True)
        log.warning(
            "%s %s: upstream broke off its answer; the client's connection is closed the same way",
            scope.get("method"),
            scope.get("path"),
        )


class BreakOffMiddleware:
    """Pure ASGI: ``break_off_on`` for every HTTP request of the app it wraps."""

    def __init__(self, app: ASGIApp, log: logging.Logger) -> None:
        self.app = app
        self.log = log
        quiet_deliberate_breaks()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await break_off_on(self.app, scope, receive, send, self.log)


class StreamResponse(Response):
    """Forward ``chunks`` as they come, and stop when the client goes away."""

    def __init__(
        self, chunks: AsyncGenerator[bytes, None], status: int, headers: dict[str, str]
    ) -> None:
        super().__init__(status_code=status)
        self.chunks = chunks
        self.raw_headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = {"type": "http.response.start", "status": self.status_code}
        await send({**start, "headers": self.raw_headers})
        task = asyncio.current_task()
        assert task is not None
        gone = asyncio.ensure_future(_disconnected(receive))
        relaying = False  # the task waits inside the loop below: a cancel lands there
        hung_up = False

        def on_gone(_: asyncio.Future[None]) -> None:
            nonlocal hung_up
            if relaying and not gone.cancelled():
                hung_up = True
                task.cancel()

        gone.add_done_callback(on_gone)
        try:
            relaying = True
            async for chunk in self.chunks:
                if len(chunk) <= TURN_BYTES:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    continue
                # A big chunk (upstream is faster than the client) goes in slices, one per
                # loop turn, so that many fast streams share the loop with everything else.
                view = memoryview(chunk)
                for at in range(0, len(chunk), TURN_BYTES):
                    piece = bytes(view[at : at + TURN_BYTES])
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
                    await asyncio.sleep(0)
            relaying = False
            await send({"type": "http.response.body", "body": b""})
        except asyncio.CancelledError:
            if not hung_up:
                raise
            task.uncancel()  # our own cancel, spent: unfinished on purpose, the call cancelled
        finally:
            relaying = False
            gone.remove_done_callback(on_gone)
            gone.cancel()
            await self.chunks.aclose()  # releases the upstream response now, not at GC


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
