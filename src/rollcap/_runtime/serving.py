"""Run ASGI apps under uvicorn on sockets bound up front, so a busy port is a clear error.

uvicorn closes a connection idle between requests, but not one that never finishes its request
headers (a client that sends them a byte a second, or nothing at all): every server here closes
such a connection after ``header_timeout_s`` (``HEADER_READ_TIMEOUT_S`` unless configured).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from rollcap._runtime.pacing import paced
from rollcap.config import HEADER_READ_TIMEOUT_S

__all__ = [
    "KEEP_ALIVE_S",
    "LINGER_BYTES",
    "LINGER_S",
    "SEND_BUFFER_BYTES",
    "bind",
    "serving",
    "serving_in_thread",
    "uvicorn_server",
]

log = logging.getLogger("rollcap.serving")

# Each accepted connection's send buffer (the kernel doubles it): 256 KiB a round trip, ample
# for model answers on a local network.
SEND_BUFFER_BYTES = 256 * 1024


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket; ``OSError`` (with the address in its message) when it cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit this. Without it a response written as headers and then
        # body waits out the client's delayed ACK (40 ms) between the two.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Accepted connections inherit this too. Left to itself the kernel grows the send
        # buffer of a client that reads nothing to megabytes, which the server fills (and, for
        # a captured stream, records) before the silence stops it; a fixed one bounds that.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


class _Listener:
    """A server's listening socket, for its connections to take the connections waiting."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.open = True
        self.taken = 0  # this turn of the loop

    def new_turn(self) -> None:
        self.taken = 0


# At most this many connections are taken per turn of the loop. Taking one is cheap; starting
# its request is not, and that is paced apart (``pacing``): a burst let in a few a turn kept a
# health check waiting in the kernel's queue behind all of it (bench/hostile.py).
_ACCEPT_PER_TURN = 1024
# How long an idle keep-alive connection stays open. Longer than the idle expiry of the clients
# agents use (the OpenAI and Anthropic SDKs' 5 s, aiohttp's 15 s), so that the client, not the
# server, closes an idle connection: a server that closes first races the client's next request
# on it, which then fails without an answer (uvicorn's default is 5 s, the SDKs' exactly).
KEEP_ALIVE_S = 65
# After an answer given before the request's body was whole (a 413), up to this much more of the
# body is read and dropped, for up to LINGER_S, so that a client still sending can read the
# answer; then the connection is closed (unless the body ended meanwhile).
LINGER_BYTES = 256 * 1024
LINGER_S = 2.0
_ACCEPTING: set[asyncio.Task[Any]] = set()


def _server_protocol(timeout_s: float, listener: _Listener | None) -> type[HttpToolsProtocol]:
    """uvicorn's HTTP protocol, with two changes.

    It closes a connection that does not finish its request headers within ``timeout_s`` of its
    opening (a first request) or of the request's first byte. Each new connection takes the
    connections waiting to be accepted (``listener``): libuv accepts one connection per turn of
    the loop, so under load, when a turn takes tens of milliseconds, a burst of connections (and
    a health check behind them) would wait seconds in the kernel's queue. And once an answer
    has gone before its request's body was whole, uvicorn would read the rest of the body to
    drop it, however long: it drops ``LINGER_BYTES`` more at most, for ``LINGER_S`` at most,
    then closes the connection.
    """

    class ServerProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _linger: asyncio.TimerHandle | None = None
        _dropped = 0

        def on_response_complete(self) -> None:
            super().on_response_complete()
            cycle = self.cycle
            if cycle is not None and cycle.more_body and not self.transport.is_closing():
                self._linger = self.loop.call_later(LINGER_S, self._stop_lingering)

        def on_body(self, body: bytes) -> None:
            cycle = self.cycle
            if cycle is not None and cycle.response_complete:
                self._dropped += len(body)
                if self._dropped > LINGER_BYTES:
                    self._stop_lingering()
                return
            super().on_body(body)

        def on_message_complete(self) -> None:
            self._end_linger()
            super().on_message_complete()

        def _end_linger(self) -> None:
            self._dropped = 0
            if self._linger is not None:
                self._linger.cancel()
                self._linger = None

        def _stop_lingering(self) -> None:
            self._end_linger()
            if not self.transport.is_closing():
                self.transport.close()

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)  # type: ignore[arg-type]
            self._arm()
            if listener is not None and listener.open:
                self._accept_waiting(listener)

        def _accept_waiting(self, listener: _Listener) -> None:
            loop = self.loop
            new = functools.partial(
                ServerProtocol,
                config=self.config,
                server_state=self.server_state,
                app_state=self.app_state,
                _loop=loop,
            )
            if listener.taken == 0:
                loop.call_soon(listener.new_turn)
            while listener.taken < _ACCEPT_PER_TURN:
                try:
                    conn, _ = listener.sock.accept()
                except OSError:  # none waiting (or the listener is gone)
                    return
                listener.taken += 1
                conn.setblocking(False)
                task = loop.create_task(loop.connect_accepted_socket(new, conn))
                _ACCEPTING.add(task)
                task.add_done_callback(functools.partial(_accepted, conn))

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._end_linger()
            super().connection_lost(exc)

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                peer = f"{self.client[0]}:{self.client[1]}" if self.client else "an unknown peer"
                log.info(
                    "closed a connection from %s: no request headers within %g s", peer, timeout_s
                )
                self.transport.close()

    return ServerProtocol


def _accepted(conn: socket.socket, task: asyncio.Task[Any]) -> None:
    _ACCEPTING.discard(task)
    if task.cancelled() or task.exception() is not None:
        conn.close()  # never handed to a transport


def uvicorn_server(
    app: Any,
    *,
    log_level: str = "warning",
    header_timeout_s: float = HEADER_READ_TIMEOUT_S,
    listener: _Listener | None = None,
) -> uvicorn.Server:
    """A uvicorn server for ``app`` on the fast loop and parser, with no headers of its own.

    The model server forwards the upstream's ``date`` and ``server`` headers; uvicorn's would
    be second copies. A connection that takes longer than ``header_timeout_s`` over its request
    headers is closed. Requests start a few per turn of the loop, ``/health`` at once
    (``rollcap._runtime.pacing``).
    """
    config = uvicorn.Config(
        paced(app),
        loop="uvloop",
        http=_server_protocol(header_timeout_s, listener),
        # Responses over WebSocket (the model server): the websockets library's sans-I/O
        # protocol, named rather than left to uvicorn's choice among what is installed.
        ws="websockets-sansio",
        log_level=log_level,
        access_log=False,
        server_header=False,
        date_header=False,
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=5,
    )
    return _Server(config)


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to its owner.

    uvicorn catches SIGINT/SIGTERM per server and raises the signal again after its own
    shutdown; with several servers in one process (an environment) each would hand the signal
    to the next mid-shutdown. The commands handle signals once and stop every server in order.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def serving(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    sock: socket.socket | None = None,
    header_timeout_s: float = HEADER_READ_TIMEOUT_S,
) -> AsyncIterator[str]:
    """Serve ``app`` in the running event loop; yields its base URL, stops on exit.

    ``sock``: a socket bound already (so a busy port was reported before anything started).
    ``header_timeout_s``: see ``uvicorn_server``.
    """
    if sock is None:
        sock = bind(host, port)
    host, bound_port = sock.getsockname()[:2]
    listener = _Listener(sock)
    server = uvicorn_server(app, header_timeout_s=header_timeout_s, listener=listener)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # the server failed to start: raise its error here
                raise RuntimeError("server stopped before it started")
            await asyncio.sleep(0.005)
        yield f"http://{host}:{bound_port}"
    finally:
        listener.open = False
        server.should_exit = True
        await task
        sock.close()


@contextlib.contextmanager
def serving_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``app`` on an event loop of its own in a thread, for synchronous callers."""
    started = threading.Event()
    stop: asyncio.Event | None = None
    loop: asyncio.AbstractEventLoop | None = None
    url: list[str] = []
    errors: list[BaseException] = []

    async def run() -> None:
        nonlocal stop, loop
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        try:
            async with serving(app, host, port) as base_url:
                url.append(base_url)
                started.set()
                await stop.wait()
        except BaseException as exc:
            errors.append(exc)
            started.set()

    thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    thread.start()
    started.wait()
    if errors:
        thread.join()
        raise errors[0]
    try:
        yield url[0]
    finally:
        assert loop is not None
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        thread.join()
