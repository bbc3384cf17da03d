"""Responses over WebSocket: a client's socket to ``/v1/responses``, relayed to the upstream's
and captured turn by turn (the I/O shell; the events are read by ``_socket_events``).

One upstream socket per client socket. Every message goes on as it came, both ways, in order,
except a client message that is no event (not a JSON object with a string ``type``): the server
answers it with the Responses API's ``error`` event itself and sends it nowhere, so that the
upstream's events stay the answers of the turns. Each ``response.create`` opens a turn, an
open call on ``/inflight`` and, with capture on and a rollout id, one record: the event's body
as the request, the server's events as the record's ``response_raw`` (SSE text), the answer
reassembled from them, ``transport: "websocket"``, and the client's other events during the
turn (``response.steer``, ...) as ``client_events``. The server's events belong to the oldest
turn not yet answered (a socket answers its turns in order); an event while no turn is open
goes to the client and into no record. The turn's terminal event (``response.completed``,
``.incomplete``, ``.failed``, ``error``) waits until its record is durable, as an HTTP stream's
does. A turn whose first event is ``error`` is recorded as an HTTP call answered with that
status and error body is.

When the client closes, its open turns end ``cancelled`` and the upstream socket is closed;
when the upstream closes, its open turns end truncated and the client's socket is closed with
the upstream's code. A handshake the upstream refuses is answered with its status before the
client's socket opens, and an unreachable upstream with 502, in the Responses error shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import aiohttp
import orjson
from starlette.responses import Response
from starlette.websockets import WebSocket

from rollcap.dialects import get_dialect
from rollcap.records import TRANSPORT_WEBSOCKET
from rollcap.routing import SCOPE_ROLLOUT_ID_KEY
from rollcap.server._answers import error_body
from rollcap.server._fresh import new_model_call_id, now
from rollcap.server._inflight import OpenCall
from rollcap.server._middleware import CAPTURE_KEY, CaptureMiddleware
from rollcap.server._recorder import CallFailure, CallRecorder
from rollcap.server._socket_events import (
    BEFORE_OUTPUT,
    CREATE,
    ERROR,
    SocketEventError,
    error_event,
    read_client_event,
    read_server_event,
    sse_frame,
)
from rollcap.server._upstream import Backend
from rollcap.server._writer import RecordWriter
from rollcap.sse import SSEEvent

__all__ = ["RESPONSES_PATH", "ResponsesSockets"]

log = logging.getLogger("rollcap.server")

RESPONSES_PATH: Final = "/v1/responses"
# The longest message taken from the upstream: one event, a whole response at most.
UPSTREAM_MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
_JSON_HEADERS: Final = {"content-type": "application/json"}
_SSE_HEADERS: Final = {"content-type": "text/event-stream"}


@dataclass(slots=True, eq=False)
class _Turn:
    inflight: OpenCall
    recorder: CallRecorder | None  # None: not captured (capture off, or no rollout id)
    answered: bool = False  # its first event came


@dataclass(slots=True)
class ResponsesSockets:
    """The model server's ``/v1/responses`` WebSocket route (``serve``); ``session`` gives the
    forwarder's aiohttp session, which opens the upstream sockets."""

    backend: Callable[[], Backend]
    session: Callable[[], aiohttp.ClientSession]
    _open: set[asyncio.Task[None]] = field(default_factory=set)

    async def serve(self, websocket: WebSocket) -> None:
        capture: CaptureMiddleware = websocket.scope[CAPTURE_KEY]
        rollout_id: str | None = websocket.scope.get(SCOPE_ROLLOUT_ID_KEY)
        backend = self.backend()
        if backend.translate_to_chat:
            message = (
                "Responses over WebSocket is not served for this model server's type: its "
                "upstream speaks Chat Completions; use POST /v1/responses"
            )
            await _refuse(websocket, 501, message)
            return
        query = websocket.scope.get("query_string", b"").decode("latin-1")
        url = backend.url_for(RESPONSES_PATH, rollout_id, query)
        # The handshake's own headers are the upstream connection's, made by its client.
        client_headers = [
            (name, value)
            for name, value in websocket.headers.items()
            if not name.lower().startswith("sec-websocket-")
        ]
        protocols = websocket.scope.get("subprotocols") or ()
        try:
            upstream = await self.session().ws_connect(
                url,
                headers=backend.headers(client_headers),
                protocols=tuple(protocols),
                max_msg_size=UPSTREAM_MAX_MESSAGE_BYTES,
                autoping=True,
            )
        except aiohttp.WSServerHandshakeError as exc:
            await _refuse(websocket, exc.status, f"upstream refused the WebSocket: {exc.message}")
            return
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            reason = str(exc) or type(exc).__name__
            await _refuse(websocket, 502, f"upstream unreachable: {reason}")
            return
        try:
            await websocket.accept(subprotocol=upstream.protocol)
            await _Relay(capture, rollout_id, websocket, upstream).run()
        finally:
            await upstream.close()


async def _refuse(websocket: WebSocket, status: int, message: str) -> None:
    """Answer the handshake with ``status`` and the error, before the socket opens."""
    kind = "invalid_request_error" if 400 <= status < 500 else "api_error"
    body = error_body("responses", kind, message)
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(
            Response(body, status_code=status, headers=_JSON_HEADERS)
        )
    else:
        await websocket.close(code=1011, reason=message[:120])


class _Relay:
    """One client socket and its upstream socket while both are open."""

    def __init__(
        self,
        capture: CaptureMiddleware,
        rollout_id: str | None,
        client: WebSocket,
        upstream: aiohttp.ClientWebSocketResponse,
    ) -> None:
        self._capture = capture
        self._state = capture.state
        self._rollout_id = rollout_id
        self._client = client
        self._upstream = upstream
        self._turns: deque[_Turn] = deque()
        self._session_id = capture.session_id(client.scope)

    async def run(self) -> None:
        from_client = asyncio.ensure_future(self._from_client())
        from_upstream = asyncio.ensure_future(self._from_upstream())
        try:
            done, _ = await asyncio.wait(
                (from_client, from_upstream), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in (from_client, from_upstream):
                task.cancel()
            await asyncio.gather(from_client, from_upstream, return_exceptions=True)
        if from_client in done and from_client.exception() is None:
            await self._end_turns(CallFailure.CANCELLED)
            return
        await self._end_turns(None)
        code = self._upstream.close_code or 1011
        with contextlib.suppress(Exception):
            await self._client.close(code=code if code != 1005 else 1000)

    # -- client to upstream

    async def _from_client(self) -> None:
        receive = self._client.receive
        upstream = self._upstream
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            text: str | None = message.get("text")
            if text is None:
                data: bytes = message.get("bytes") or b""
                await upstream.send_bytes(data)
                continue
            try:
                event = read_client_event(text)
            except SocketEventError as exc:
                await self._client.send_text(error_event(400, exc.code, str(exc)).decode())
                continue
            if event.type == CREATE:
                assert event.body is not None
                self._open_turn(event.body)
            elif self._turns and self._turns[0].recorder is not None:
                self._turns[0].recorder.client_event(event.event)
            await upstream.send_str(text)

    def _open_turn(self, body: bytes) -> None:
        clock = now()
        state = self._state
        inflight = state.inflight.open(
            self._rollout_id, "responses", started_at=clock.wall, started=clock.mono
        )
        recorder = None
        if self._rollout_id is None:
            state.uncorrelated += 1
        elif state.writer is not None:
            recorder = CallRecorder(
                model_call_id=new_model_call_id(),
                dialect="responses",
                server_name=state.server_name,
                start=clock,
                client_session_id=self._session_id,
                max_response_bytes=self._capture.capture_max_response_bytes,
                transport=TRANSPORT_WEBSOCKET,
            )
            recorder.request(body)
            recorder.upstream_attempt()
            inflight.model_call_id = recorder.model_call_id
        self._turns.append(_Turn(inflight, recorder))

    # -- upstream to client

    async def _from_upstream(self) -> None:
        async for message in self._upstream:
            if message.type is aiohttp.WSMsgType.TEXT:
                await self._server_text(message.data)
            elif message.type is aiohttp.WSMsgType.BINARY:
                await self._client.send_bytes(message.data)
            else:  # closed, closing or broken: the relay ends
                return

    async def _server_text(self, data: str) -> None:
        turn = self._turns[0] if self._turns else None
        if turn is None:
            await self._client.send_text(data)
            return
        mono = time.monotonic()
        size = len(data)
        call = turn.inflight
        event = read_server_event(data)
        recorder = turn.recorder
        terminal = False
        if not turn.answered:
            turn.answered = True
            failed = event.type == ERROR
            status = (event.status or 500) if failed else 200
            call.answer_started(status, streamed=not failed)
            if recorder is not None:
                recorder.upstream_status(status)
                recorder.response_start(status, _JSON_HEADERS if failed else _SSE_HEADERS)
                if failed:
                    # Answered with an error at once: recorded as an HTTP call answered with
                    # the error's status and body is.
                    recorder.first_byte(mono)
                    recorder.body(_error_body(data))
            terminal = failed
        call.upstream_bytes(mono, size)
        if not terminal:
            if recorder is not None:
                if event.type not in BEFORE_OUTPUT:
                    recorder.first_byte(mono)
                terminal = recorder.body(sse_frame(event.type, data))
            else:
                terminal = _RESPONSES.is_terminal_event(SSEEvent(data=data, event=event.type))
        if not terminal:
            await self._client.send_text(data)
            call.client(time.monotonic(), size, last=False)
            return
        self._turns.popleft()
        try:
            if recorder is not None:
                recorder.finish(now())
                await self._capture.write(self._writer(), self._rollout_id or "", recorder, call)
            await self._client.send_text(data)
            call.client(time.monotonic(), size, last=True)
        finally:
            self._close(call)

    def _writer(self) -> RecordWriter:
        writer = self._state.writer
        assert writer is not None  # a turn is only recorded with capture on
        return writer

    async def _end_turns(self, failure: CallFailure | None) -> None:
        """The socket closed: each open turn ends, ``failure`` its cause (``None``: the
        upstream's doing, so the record says what it lacks: truncated)."""
        mono = time.monotonic()
        while self._turns:
            turn = self._turns.popleft()
            if failure is CallFailure.CANCELLED:
                turn.inflight.client_left(mono)
            try:
                if turn.recorder is not None:
                    turn.recorder.finish(now(), failure)
                    await self._capture.write(
                        self._writer(), self._rollout_id or "", turn.recorder, turn.inflight
                    )
            finally:
                self._close(turn.inflight)

    def _close(self, call: OpenCall) -> None:
        state = self._state
        state.inflight.close(call, time.monotonic())
        if state.call_ended is not None:
            state.call_ended(call)


_RESPONSES: Final = get_dialect("responses")


def _error_body(data: str) -> bytes:
    """An ``error`` event's answer as an HTTP call's error body: ``{"error": ...}``."""
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data.encode()
    if isinstance(event, dict) and isinstance(event.get("error"), dict):
        return orjson.dumps({"error": event["error"]})
    return data.encode()
