"""Forwarding one call upstream and its answer back, for the model server and the worker.

``open_upstream`` sends the request and returns upstream's response once its headers are in;
``pass_through`` turns that response into the client's, as it came; ``read_whole`` reads it
whole for a server that must change it first. ``upstream_failures`` is the one place where
aiohttp's and the timeout's failures become what the client is answered (a status and an error
type) and what the call's record says (an ``ErrorCategory``), as httpx's
``map_httpcore_exceptions`` does for httpcore.

An answer upstream breaks off after its headers (cut short, or silent past the read timeout)
reaches the client as it came: upstream's status and headers, the bytes that arrived, then a
broken connection (``relay.UpstreamBroke``), streamed or not. That is what the client would have
seen without the proxy, and never a clean end an SDK could take for a whole answer; a 502 of
our own instead would tell the client that upstream answered 502, which it did not.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Iterator
from typing import Protocol

import aiohttp
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from rollcap._proxy.headers import for_client
from rollcap._proxy.relay import StreamResponse, UpstreamBroke
from rollcap.records import ErrorCategory
from rollcap.sse import is_event_stream

__all__ = [
    "UPSTREAM_KEEP_ALIVE_S",
    "Observer",
    "UpstreamFailure",
    "forwarding_session",
    "open_upstream",
    "pass_through",
    "read_whole",
    "relay",
    "upstream_failures",
]


class UpstreamFailure(Exception):
    """Upstream ended a call without a whole answer. ``str()`` says so, beginning "upstream".

    ``status``: what the client is answered (504 when upstream was too slow, else 502);
    ``kind``: the error body's type; ``category``: what the call's record says
    (``TIMEOUT``, ``CONNECTION``, or ``None`` when the answer broke off part-way, where what
    arrived tells: truncated, unparseable); ``what`` and ``detail``: the words, for callers that
    name the upstream otherwise.
    """

    def __init__(
        self,
        status: int,
        kind: str,
        category: ErrorCategory | None,
        what: str,
        detail: str | None = None,
    ) -> None:
        super().__init__(f"upstream {what}" + ("" if detail is None else f": {detail}"))
        self.status = status
        self.kind = kind
        self.category = category
        self.what = what
        self.detail = detail

    @property
    def timed_out(self) -> bool:
        return self.category is ErrorCategory.TIMEOUT


@contextlib.contextmanager
def upstream_failures(*, answering: bool = False) -> Iterator[None]:
    """Raise ``UpstreamFailure`` for aiohttp's and the timeout's failures inside the block.

    ``answering``: the block reads the body of an answer whose headers came already.
    """
    try:
        yield
    except TimeoutError as exc:
        what = "went silent before the end of its answer" if answering else "did not answer in time"
        raise UpstreamFailure(504, "timeout", ErrorCategory.TIMEOUT, what) from exc
    except aiohttp.ClientError as exc:
        if answering:
            raise UpstreamFailure(502, "api_error", None, "broke off its answer", str(exc)) from exc
        raise UpstreamFailure(
            502, "api_connection_error", ErrorCategory.CONNECTION, "unreachable", str(exc)
        ) from exc


class Observer(Protocol):
    """Who watches a forwarded answer: the model server's call recorder, its open-call view."""

    def upstream_bytes(self, mono: float, size: int) -> None:
        """``size`` bytes of the answer came at monotonic time ``mono``."""

    def upstream_failed(self, category: ErrorCategory) -> None: ...


# An idle upstream connection is closed after this long, before the upstream closes it: uvicorn,
# which serves vLLM, closes one after 5 s, and a request sent on a connection as the server closes
# it fails without an answer (aiohttp retries no POST).
UPSTREAM_KEEP_ALIVE_S = 4.0


def forwarding_session(*, connect_timeout_s: float, read_timeout_s: float) -> aiohttp.ClientSession:
    """One session for all of a server's upstream calls: unbounded pool, bytes as they came.

    ``read_timeout_s`` is the longest silence between two upstream bytes, not a total: a long
    generation that keeps streaming is never cut.
    """
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            limit=0, ttl_dns_cache=300, keepalive_timeout=UPSTREAM_KEEP_ALIVE_S
        ),
        timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        ),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
    )


async def open_upstream(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    body: bytes | bytearray | None,
    headers: list[tuple[str, str]],
) -> aiohttp.ClientResponse:
    """Upstream's response, its headers read; ``UpstreamFailure`` when there is none.

    The caller releases it (``pass_through`` and ``read_whole`` do).
    """
    with upstream_failures():
        return await session.request(method, url, data=body, headers=headers)


async def read_whole(upstream: aiohttp.ClientResponse) -> bytes:
    """Upstream's whole body, the response released; ``UpstreamFailure`` when it breaks off."""
    try:
        with upstream_failures(answering=True):
            return await upstream.read()
    finally:
        upstream.release()


async def pass_through(upstream: aiohttp.ClientResponse, observer: Observer | None) -> Response:
    """The client's answer: upstream's status, headers and bytes as they came (see the module
    docstring for an answer upstream breaks off). A stream is relayed chunk by chunk; a body is
    read first. ``observer`` hears of the first byte and of a silent upstream."""
    headers = for_client(upstream.headers)
    if is_event_stream(upstream.headers.get("content-type")):
        return StreamResponse(relay(upstream, observer), upstream.status, headers)
    chunks: list[bytes] = []
    try:
        with upstream_failures(answering=True):
            async for chunk in upstream.content.iter_any():
                if observer is not None:
                    observer.upstream_bytes(time.monotonic(), len(chunk))
                chunks.append(chunk)
    except UpstreamFailure as failure:
        _tell(observer, failure)
        length = upstream.headers.get("content-length")
        cut_headers = headers if length is None else {**headers, "content-length": length}
        return _CutResponse(b"".join(chunks), upstream.status, cut_headers, str(failure))
    finally:
        upstream.release()
    return Response(b"".join(chunks), status_code=upstream.status, headers=headers)


async def relay(
    upstream: aiohttp.ClientResponse, observer: Observer | None
) -> AsyncGenerator[bytes, None]:
    """Upstream's body as it comes, released at the end; broken off or silent too long, it
    raises ``UpstreamBroke``, which breaks the client's connection the same way."""
    try:
        with upstream_failures(answering=True):
            async for chunk in upstream.content.iter_any():
                if observer is not None:
                    observer.upstream_bytes(time.monotonic(), len(chunk))
                yield chunk
    except UpstreamFailure as failure:
        _tell(observer, failure)
        raise UpstreamBroke(str(failure)) from failure
    finally:
        upstream.release()


def _tell(observer: Observer | None, failure: UpstreamFailure) -> None:
    if observer is not None and failure.category is not None:
        observer.upstream_failed(failure.category)


class _CutResponse(Response):
    """Headers and a partial body, then the connection is dropped: what upstream did."""

    def __init__(self, body: bytes, status: int, headers: dict[str, str], why: str) -> None:
        super().__init__(status_code=status)
        self.partial = body
        self.why = why
        self.raw_headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        await send({"type": "http.response.body", "body": self.partial, "more_body": True})
        raise UpstreamBroke(self.why)
