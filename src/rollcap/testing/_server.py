"""The fake upstream's HTTP shell: an aiohttp server that sends what ``_scenarios`` decides.

Every handler is thin: read the request, note it, ask ``answer`` for a ``Reply``, carry it out.
The one thing decided here is time: the waits a reply asks for, and the server stopping, which
ends every wait (and every hanging request) by closing its connection.

A WebSocket on ``/v1/responses`` is two tasks: the handler reads the client's messages (noting
each, queueing it) and a worker answers them one at a time, asking the socket's
``ResponsesSocket`` for a ``SocketReply`` and carrying it out. Reading apart from answering lets
the socket notice a client that leaves, or closes, in the middle of a turn (or of a hang), while
the turns still go one after another. A turn cut by its scenario ends the socket with a close
frame of code 1011; ``stop()`` closes every socket with code 1001. Either way the connection
closes right after the close frame, without waiting for the client's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import orjson
from aiohttp import WSCloseCode, WSMsgType, web
from multidict import CIMultiDict

from rollcap.testing._scenarios import (
    Reply,
    ReplyKind,
    answer,
    error_reply,
    is_authorized,
    models_list,
)
from rollcap.testing._socket import ResponsesSocket, SocketReply

__all__ = ["FakeUpstream", "ReceivedRequest"]

_ROUTES = {
    "/v1/responses": "responses",
    "/v1/chat/completions": "chat",
    "/v1/messages": "messages",
}
_MAX_BODY = 256 * 1024 * 1024
# Handlers end at once when the server stops (see ``_pause``); this only bounds a stuck write.
_SHUTDOWN_TIMEOUT_S = 2.0
_THREAD_START_TIMEOUT_S = 60.0
# How long closing a WebSocket may wait for the client's close frame. While the handler reads, as
# it always does here, aiohttp sends the close frame and closes the connection without waiting;
# this only bounds the wait should nothing be reading.
_SOCKET_CLOSE_TIMEOUT_S = 1.0
_SOCKET_PATH = "/v1/responses"
_CUT_REASON = b"the fake upstream cut the turn"
_STOP_REASON = b"the fake upstream is stopping"

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class ReceivedRequest:
    """One request as the fake received it. ``json`` is the parsed body, ``None`` when the body
    is empty or not JSON; ``headers`` has lower-case names; ``query`` the raw query string.

    Each message a client sends on a WebSocket is one, as it arrives: ``method`` ``WEBSOCKET``,
    the socket's path, its handshake's headers and query, the message (UTF-8) as ``body``.
    """

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    json: Any
    query: str = ""


class _Stopping(Exception):
    """The server is stopping: the handler closes its connection and returns."""


@dataclass(slots=True, eq=False)
class _Socket:
    """One open WebSocket: its state, the messages waiting for their turn, and its close once
    begun (by a turn that cuts it, or by ``stop()``)."""

    ws: web.WebSocketResponse
    core: ResponsesSocket
    queue: asyncio.Queue[str | bytes]
    closing: asyncio.Task[bool] | None = None

    def close(self, code: int, reason: bytes) -> asyncio.Task[bool]:
        """Begin the close handshake (once: a second call gets the first close). A task of its
        own, so that neither the worker nor ``stop()`` being cancelled cuts it short, and the
        handler can wait for it: the connection ends when the handler returns."""
        if self.closing is None:
            self.closing = asyncio.create_task(self.ws.close(code=code, message=reason))
        return self.closing


class FakeUpstream:
    """A fake OpenAI / Anthropic model API on a real socket, for tests and benchmarks.

    ``async with FakeUpstream() as upstream:`` (or ``await start()`` / ``await stop()``) serves
    on ``upstream.url``; ``FakeUpstream.running_in_thread()`` serves from a background thread for
    synchronous code. ``requests`` lists what was received, ``in_flight`` counts requests being
    answered (a WebSocket while one of its turns is) and ``open_connections`` the client
    connections held open (a WebSocket's among them).
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None):
        self._host = host
        self._port = port
        self._api_key = api_key
        self.requests: list[ReceivedRequest] = []
        self._runner: web.AppRunner | None = None
        self._closing: asyncio.Event | None = None
        self._url: str | None = None
        self._in_flight = 0
        self._sockets: set[_Socket] = set()

    # -- lifecycle

    @property
    def url(self) -> str:
        """``http://host:port`` (no trailing slash); kept after ``stop``."""
        if self._url is None:
            raise RuntimeError("FakeUpstream has not been started")
        return self._url

    @property
    def running(self) -> bool:
        return self._runner is not None

    @property
    def in_flight(self) -> int:
        """Requests received and not yet answered (or dropped), WebSocket turns included."""
        return self._in_flight

    @property
    def open_connections(self) -> int:
        """Client connections currently open."""
        server = self._runner.server if self._runner is not None else None
        return len(server.connections) if server is not None else 0

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("FakeUpstream is already running")
        self._closing = asyncio.Event()
        app = web.Application(client_max_size=_MAX_BODY)
        for path, dialect in _ROUTES.items():
            app.router.add_post(path, self._dialect_handler(dialect))
        app.router.add_get(_SOCKET_PATH, self._responses_socket, allow_head=False)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        runner = web.AppRunner(
            app,
            access_log=None,
            handler_cancellation=True,  # a client that leaves cancels its handler
            shutdown_timeout=_SHUTDOWN_TIMEOUT_S,
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, self._host, self._port).start()
            host, port = runner.addresses[0][:2]
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    async def stop(self) -> None:
        """Stop listening, end hanging and waiting requests, close every connection (each
        WebSocket with code 1001, going away)."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        if self._closing is not None:
            self._closing.set()
        # aiohttp's shutdown would wait out its timeout for a socket's handler, which only ends
        # when its socket closes.
        closes = [socket.close(WSCloseCode.GOING_AWAY, _STOP_REASON) for socket in self._sockets]
        if closes:
            await asyncio.wait(closes)
        await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @classmethod
    @contextlib.contextmanager
    def running_in_thread(
        cls, *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None
    ) -> Iterator[FakeUpstream]:
        """Serve from a background thread with its own event loop, for synchronous callers.

        The upstream is started when the block begins and stopped (thread joined) when it ends.
        """
        upstream = cls(host=host, port=port, api_key=api_key)
        thread = _ServerThread(upstream)
        thread.start()
        try:
            yield upstream
        finally:
            thread.stop()

    # -- handlers

    def _dialect_handler(self, dialect: str) -> _Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            self._in_flight += 1
            try:
                raw = await self._receive(request)
                reply = answer(
                    dialect,
                    raw,
                    request.headers,
                    request_id=_request_id(),
                    api_key=self._api_key,
                )
                return await self._send(request, reply)
            finally:
                self._in_flight -= 1

        return handle

    async def _models(self, request: web.Request) -> web.StreamResponse:
        self._in_flight += 1
        try:
            await self._receive(request)
            request_id = _request_id()
            if self._api_key is not None and not is_authorized(
                "messages", request.headers, self._api_key
            ):
                return await self._send(request, error_reply("chat", 401, request_id))
            return _json_response(models_list(), {"x-request-id": request_id})
        finally:
            self._in_flight -= 1

    async def _health(self, request: web.Request) -> web.StreamResponse:
        await self._receive(request)
        # What another process needs to watch the fake: this connection is among the open ones.
        counts = {"in_flight": self._in_flight, "open_connections": self.open_connections}
        return _json_response({"status": "ok", **counts}, {})

    async def _receive(self, request: web.Request) -> bytes:
        raw = await request.read()
        self._note(request, request.method, raw)
        return raw

    def _note(self, request: web.Request, method: str, raw: bytes) -> None:
        try:
            parsed: Any = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            parsed = None
        self.requests.append(
            ReceivedRequest(
                method=method,
                path=request.path,
                headers={name.lower(): value for name, value in request.headers.items()},
                body=raw,
                json=parsed,
                query=request.query_string,
            )
        )

    # -- the Responses WebSocket

    async def _responses_socket(self, request: web.Request) -> web.StreamResponse:
        """``GET /v1/responses`` upgraded to a WebSocket: Responses turns, one after another."""
        ws = web.WebSocketResponse(max_msg_size=_MAX_BODY, timeout=_SOCKET_CLOSE_TIMEOUT_S)
        if request.headers.get("upgrade", "").strip().lower() != "websocket":
            # A plain GET: the route stays POST's, as it was before WebSocket mode. (A bad
            # handshake is aiohttp's 400, from ``prepare``.)
            raise web.HTTPMethodNotAllowed(request.method, ["POST"])
        if self._api_key is not None and not is_authorized(
            "responses", request.headers, self._api_key
        ):
            # Refused before the upgrade, with the body the HTTP route would answer.
            return await self._send(request, error_reply("responses", 401, _request_id()))
        await ws.prepare(request)
        socket = _Socket(
            ws, ResponsesSocket(request.headers, api_key=self._api_key), asyncio.Queue()
        )
        self._sockets.add(socket)
        worker = asyncio.create_task(self._answer_turns(socket))
        try:
            async for message in ws:
                if message.type is WSMsgType.TEXT or message.type is WSMsgType.BINARY:
                    data: str | bytes = message.data
                    self._note(
                        request, "WEBSOCKET", data.encode() if isinstance(data, str) else data
                    )
                    socket.queue.put_nowait(data)
        finally:
            # The client left or closed, or a close began here: no turn goes on.
            self._sockets.discard(socket)
            worker.cancel()
            await asyncio.wait([worker])
            if not worker.cancelled():
                worker.result()  # a failure of the worker is the handler's
            if socket.closing is not None:
                # Let the close handshake finish (bounded by the socket's close timeout).
                await asyncio.wait([socket.closing])
        return ws

    async def _answer_turns(self, socket: _Socket) -> None:
        """Answer the socket's messages in the order they came, each once the one before it is
        answered, until a turn closes the socket or hangs it."""
        while True:
            message = await socket.queue.get()
            reply = socket.core.receive(message, request_id=_request_id())
            self._in_flight += 1
            try:
                if not await self._carry_out(socket, reply):
                    return
            finally:
                self._in_flight -= 1

    async def _carry_out(self, socket: _Socket, reply: SocketReply) -> bool:
        """Send what ``reply`` asks; ``False`` when the socket takes no more turns."""
        ws = socket.ws
        try:
            await self._pause(reply.delay_s)
            if reply.hang:
                await self._pause(None)
            for index, text in enumerate(reply.messages):
                if index:
                    await self._pause(reply.chunk_delay_s)
                await ws.send_str(text)
        except (_Stopping, ConnectionError):
            # The server stopping closes the socket itself; a socket the client broke is the
            # handler's to notice.
            return False
        if reply.close:
            socket.close(WSCloseCode.INTERNAL_ERROR, _CUT_REASON)
            return False
        return True

    # -- carrying a reply out

    async def _send(self, request: web.Request, reply: Reply) -> web.StreamResponse:
        response: web.StreamResponse | None = None
        try:
            await self._pause(reply.delay_s)
            if reply.kind is ReplyKind.HANG:
                await self._pause(None)
            if reply.kind is ReplyKind.DISCONNECT:
                return _drop(request, None)
            response = web.StreamResponse(status=reply.status, headers=CIMultiDict(reply.headers))
            if reply.kind is ReplyKind.BODY:
                response.content_length = (
                    reply.declared_length if reply.declared_length is not None else len(reply.body)
                )
                await response.prepare(request)
                await response.write(reply.body)
            else:
                await response.prepare(request)
                for index, frame in enumerate(reply.events):
                    if index:
                        await self._pause(reply.chunk_delay_s)
                    await response.write(frame)
                while reply.repeat:  # until the client leaves or the server stops
                    await self._pause(reply.chunk_delay_s)
                    await response.write(reply.repeat)
                    await asyncio.sleep(0)  # a client that keeps up must not starve the rest
            if reply.cut:
                return _drop(request, response)
            await response.write_eof()
            return response
        except (_Stopping, ConnectionError):
            return _drop(request, response)

    async def _pause(self, seconds: float | None) -> None:
        """Wait ``seconds`` (``None``: forever); raise ``_Stopping`` if the server stops first."""
        if seconds is not None and seconds <= 0:
            return
        closing = self._closing
        if closing is None:  # pragma: no cover - handlers only run between start and stop
            raise _Stopping
        try:
            async with asyncio.timeout(seconds):
                await closing.wait()
        except TimeoutError:
            return
        raise _Stopping


def _request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def _json_response(value: Any, headers: Mapping[str, str]) -> web.Response:
    return web.Response(
        body=orjson.dumps(value), content_type="application/json", headers=dict(headers)
    )


def _drop(request: web.Request, response: web.StreamResponse | None) -> web.StreamResponse:
    """Close the connection where it stands; aiohttp then finishes nothing more on it."""
    transport = request.transport
    if transport is not None:
        transport.close()
    return response if response is not None else web.Response()


class _ServerThread:
    """Runs one ``FakeUpstream`` on an event loop of its own, in a daemon thread."""

    def __init__(self, upstream: FakeUpstream) -> None:
        self._upstream = upstream
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._main, name="rollcap-fake-upstream", daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(_THREAD_START_TIMEOUT_S):  # pragma: no cover - a stuck start
            raise RuntimeError("FakeUpstream did not start in its thread")
        if self._error is not None:
            self._thread.join()
            raise self._error

    def stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and self._thread.is_alive():
            loop.call_soon_threadsafe(stop.set)
        self._thread.join()

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            await self._upstream.start()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await self._upstream.stop()
