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
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import orjson
from starlette.responses import Response
from starlette.websockets import WebSocket, WebSocketDisconnect

from rollcap._json import load_json_object
from rollcap._proxy.forward import UpstreamFailure, open_upstream, relay, upstream_failures
from rollcap._proxy.relay import UpstreamBroke
from rollcap.config import WEBSOCKET_MAX_SOCKETS, WEBSOCKET_MAX_STORED_RESPONSES
from rollcap.dialects import context_length_exceeded, error_message, get_dialect
from rollcap.records import TRANSPORT_WEBSOCKET
from rollcap.routing import SCOPE_ROLLOUT_ID_KEY
from rollcap.server._answers import error_body
from rollcap.server._fresh import new_model_call_id, now
from rollcap.server._inflight import OpenCall
from rollcap.server._middleware import CAPTURE_KEY, CaptureMiddleware
from rollcap.server._recorder import CallFailure, CallRecorder, LocalReason
from rollcap.server._socket_events import (
    BEFORE_OUTPUT,
    CREATE,
    ERROR,
    ClientEvent,
    SocketEventError,
    error_event,
    read_client_event,
    read_server_event,
    sse_frame,
)
from rollcap.server._socket_state import PreviousResponseNotFound, SocketState, prepared_response
from rollcap.server._translating import CHAT_PATH, Translation
from rollcap.server._upstream import Backend
from rollcap.sse import SSEDecoder, SSEEvent, is_event_stream

__all__ = [
    "MAX_OPEN_TURNS",
    "RESPONSES_PATH",
    "ResponsesSockets",
]

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
    """The model server's ``/v1/responses`` WebSocket route (``serve``). ``forwarder`` gives the
    backend and the aiohttp session that reaches the upstream; at most ``max_sockets`` are open
    at once, and a translated socket keeps at most ``max_stored_responses`` responses."""

    backend: Callable[[], Backend]
    session: Callable[[], aiohttp.ClientSession]
    max_sockets: int = WEBSOCKET_MAX_SOCKETS
    max_stored_responses: int = WEBSOCKET_MAX_STORED_RESPONSES
    open: int = 0

    async def serve(self, websocket: WebSocket) -> None:
        if self.open >= self.max_sockets:
            await _refuse(
                websocket,
                503,
                f"this model server has {self.open} WebSockets open, its limit "
                f"(websocket_max_sockets={self.max_sockets}); close one or use POST /v1/responses",
            )
            return
        self.open += 1
        try:
            backend = self.backend()
            if backend.translate_to_chat:
                await websocket.accept()
                turns = _TranslatedSocket(websocket, backend, self.session(), self)
                await turns.run()
            else:
                await self._pass_through(websocket, backend)
        finally:
            self.open -= 1

    async def _pass_through(self, websocket: WebSocket, backend: Backend) -> None:
        rollout_id: str | None = websocket.scope.get(SCOPE_ROLLOUT_ID_KEY)
        query = websocket.scope.get("query_string", b"").decode("latin-1")
        url = backend.url_for(RESPONSES_PATH, rollout_id, query)
        protocols = websocket.scope.get("subprotocols") or ()
        try:
            upstream = await self.session().ws_connect(
                url,
                headers=backend.headers(_client_headers(websocket)),
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
            await _Relay(websocket, upstream).run()
        finally:
            await upstream.close()


def _client_headers(websocket: WebSocket) -> list[tuple[str, str]]:
    """The handshake's headers as a call's: its own (``sec-websocket-*``) belong to the
    connection, and the upstream connection makes its own."""
    return [
        (name, value)
        for name, value in websocket.headers.items()
        if not name.lower().startswith("sec-websocket-")
    ]


async def _refuse(websocket: WebSocket, status: int, message: str) -> None:
    """Answer the handshake with ``status`` and the error, before the socket opens."""
    log.info("WebSocket %s refused (%d): %s", websocket.scope.get("path"), status, message)
    kind = "invalid_request_error" if 400 <= status < 500 else "api_error"
    body = error_body("responses", kind, message)
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(
            Response(body, status_code=status, headers=_JSON_HEADERS)
        )
    else:
        await websocket.close(code=1011, reason=message[:120])


class _Turns:
    """A client socket's turns, oldest first, each an open call and (captured) a recorder: the
    events of the oldest go into its record, and its terminal event waits for the record."""

    def __init__(self, client: WebSocket) -> None:
        self._client = client
        self._capture: CaptureMiddleware = client.scope[CAPTURE_KEY]
        self._state = self._capture.state
        self._rollout_id: str | None = client.scope.get(SCOPE_ROLLOUT_ID_KEY)
        self._turns: deque[_Turn] = deque()
        self._session_id = self._capture.session_id(client.scope)

    def _open_turn(self, body: bytes) -> _Turn:
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
            inflight.model_call_id = recorder.model_call_id
        turn = _Turn(inflight, recorder)
        self._turns.append(turn)
        return turn

    def _client_event(self, event: dict[str, Any]) -> None:
        """A client event other than ``response.create``: kept with the turn it steers."""
        if self._turns and self._turns[0].recorder is not None:
            self._turns[0].recorder.client_event(event)

    async def _event(self, data: str, local: LocalReason | None = None) -> bool:
        """One server event to the client, into the oldest open turn's record; true when it
        ended that turn. ``local``: the server answers the turn itself, for that reason."""
        turn = self._turns[0] if self._turns else None
        if turn is None:
            await self._client.send_text(data)
            return False
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
                if local is not None:
                    recorder.answered_locally(local)
                else:
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
            return False
        self._turns.popleft()
        try:
            await self._record(turn, None)
            await self._client.send_text(data)
            call.client(time.monotonic(), size, last=True)
        finally:
            self._close(call)
        return True

    async def _record(self, turn: _Turn, failure: CallFailure | None) -> None:
        """The turn is over (``failure``: why it did not complete): its record, made durable."""
        recorder = turn.recorder
        if recorder is None:
            return
        writer = self._state.writer
        assert writer is not None  # a turn is only recorded with capture on
        recorder.finish(now(), failure)
        await self._capture.write(writer, self._rollout_id or "", recorder, turn.inflight)

    async def _end_turns(self, failure: CallFailure | None) -> None:
        """The socket closed: each open turn ends, ``failure`` its cause (``None``: the
        upstream's doing, so the record says what it lacks: truncated)."""
        mono = time.monotonic()
        while self._turns:
            turn = self._turns.popleft()
            if failure is CallFailure.CANCELLED:
                turn.inflight.client_left(mono)
            try:
                await self._record(turn, failure)
            finally:
                self._close(turn.inflight)

    def _close(self, call: OpenCall) -> None:
        state = self._state
        state.inflight.close(call, time.monotonic())
        if state.call_ended is not None:
            state.call_ended(call)

    async def _refused(self, error: SocketEventError) -> None:
        """A message that is no event: the server's own error event, sent nowhere else."""
        await self._client.send_text(error_event(400, error.code, str(error)).decode())

    async def _next_event(self) -> tuple[ClientEvent, str | bytes] | None:
        """The client's next event and its message as it came (an event may come as a binary
        message too); ``None`` once the client has gone. A message that is no event is
        answered here (``_refused``) and skipped."""
        while True:
            message = await self._client.receive()
            if message["type"] == "websocket.disconnect":
                return None
            text: str | None = message.get("text")
            data: str | bytes = text if text is not None else message.get("bytes") or b""
            try:
                return read_client_event(data), data
            except SocketEventError as exc:
                await self._refused(exc)


class _Relay(_Turns):
    """One client socket and its upstream socket while both are open."""

    def __init__(self, client: WebSocket, upstream: aiohttp.ClientWebSocketResponse) -> None:
        super().__init__(client)
        self._upstream = upstream

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
        broke = _unexpected(self._client, done)
        await self._end_turns(CallFailure.EXCEPTION if broke else None)
        code = 1011 if broke else self._upstream.close_code or 1011
        with contextlib.suppress(Exception):
            await self._client.close(code=code if code != 1005 else 1000)

    async def _from_client(self) -> None:
        upstream = self._upstream
        while (received := await self._next_event()) is not None:
            event, data = received
            if event.type == CREATE:
                assert event.body is not None
                if len(self._turns) >= MAX_OPEN_TURNS:
                    # A client that sends turns faster than they are answered waits for them;
                    # one that does not is told so, and what it sent goes nowhere.
                    why = f"at most {MAX_OPEN_TURNS} turns may wait on one socket"
                    await self._refused(SocketEventError(why, "too_many_turns"))
                    continue
                turn = self._open_turn(event.body)
                if turn.recorder is not None:
                    turn.recorder.upstream_attempt()
            else:
                self._client_event(event.event)
            # On as it came: text as text, binary as binary.
            if isinstance(data, str):
                await upstream.send_str(data)
            else:
                await upstream.send_bytes(data)

    async def _from_upstream(self) -> None:
        async for message in self._upstream:
            if message.type is aiohttp.WSMsgType.TEXT:
                await self._event(message.data)
            elif message.type is aiohttp.WSMsgType.BINARY:
                await self._client.send_bytes(message.data)
            else:  # closed, closing or broken: the relay ends
                return


class _TranslatedSocket(_Turns):
    """A client socket answered turn by turn through a Chat Completions upstream, the socket's
    state held here (``SocketState``): each turn one complete chat call."""

    def __init__(
        self,
        client: WebSocket,
        backend: Backend,
        session: aiohttp.ClientSession,
        limits: ResponsesSockets,
    ) -> None:
        super().__init__(client)
        self._backend = backend
        self._session = session
        self._conversation = SocketState(limits.max_stored_responses)
        # Turns are answered one at a time, in order; a few may wait, then the client waits.
        self._waiting: asyncio.Queue[ClientEvent] = asyncio.Queue(_WAITING_TURNS)

    async def run(self) -> None:
        reader = asyncio.ensure_future(self._read())
        answering = asyncio.ensure_future(self._answer_all())
        try:
            done, _ = await asyncio.wait((reader, answering), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, answering):
                task.cancel()
            await asyncio.gather(reader, answering, return_exceptions=True)
        if _unexpected(self._client, done):
            await self._end_turns(CallFailure.EXCEPTION)
            with contextlib.suppress(Exception):
                await self._client.close(code=1011)
            return
        await self._end_turns(CallFailure.CANCELLED)

    async def _read(self) -> None:
        while (received := await self._next_event()) is not None:
            event, _ = received
            if event.type == CREATE:
                await self._waiting.put(event)
            else:
                # Nothing to steer here: the turn answers in one chat call; kept with it.
                self._client_event(event.event)

    async def _answer_all(self) -> None:
        while True:
            event = await self._waiting.get()
            assert event.body is not None
            self._open_turn(event.body)
            await self._answer(event.event)

    async def _answer(self, event: dict[str, object]) -> None:
        request = {key: value for key, value in event.items() if key != "type"}
        generate = request.pop("generate", True)
        try:
            full = self._conversation.expand(request)
        except PreviousResponseNotFound as exc:
            await self._local_error(
                400, "previous_response_not_found", str(exc), LocalReason.INVALID_REQUEST
            )
            return
        except ValueError as exc:
            await self._local_error(
                400, "invalid_request_error", str(exc), LocalReason.INVALID_REQUEST
            )
            return
        if generate is False:
            await self._prepare(full)
            return
        full["stream"] = True
        try:
            translation = Translation(
                "responses", full, answer_id=new_model_call_id(), created=time.time()
            )
        except ValueError as exc:
            await self._local_error(
                400, "invalid_request_error", f"invalid request: {exc}", LocalReason.INVALID_REQUEST
            )
            return
        turn = self._turns[0]
        if turn.recorder is not None:
            turn.recorder.upstream_attempt()
        body = orjson.dumps(translation.chat_request)
        headers = self._backend.headers(_client_headers(self._client), content_type=_JSON)
        url = self._backend.url_for(CHAT_PATH, self._rollout_id)
        try:
            upstream = await open_upstream(self._session, "POST", url, body, headers)
        except UpstreamFailure as failure:
            await self._failed(failure)
            return
        if turn.recorder is not None:
            turn.recorder.upstream_status(upstream.status)
        if not (200 <= upstream.status < 300 and is_event_stream(upstream.headers.get(_CT))):
            await self._upstream_error(upstream)
            return
        await self._stream(upstream, translation, full)

    async def _stream(
        self, upstream: aiohttp.ClientResponse, translation: Translation, full: dict[str, object]
    ) -> None:
        translator = translation.stream()
        decoder = SSEDecoder()
        turn = self._turns[0]
        try:
            async with contextlib.aclosing(relay(upstream, turn.inflight)) as chunks:
                async for chunk in chunks:
                    for event in decoder.feed(chunk):
                        for out in translator.feed(event):
                            if await self._translated(out, full):
                                return
        except UpstreamBroke:
            pass  # what came is what the record holds: it says truncated
        else:
            for out in [e for event in decoder.flush() for e in translator.feed(event)]:
                if await self._translated(out, full):
                    return
            for out in translator.finish():
                if await self._translated(out, full):
                    return
        # The upstream's answer ended without the turn's terminal event.
        await self._end_turns(None)
        message = "upstream broke off its answer"
        await self._client.send_text(error_event(502, "upstream_error", message).decode())

    async def _translated(self, event: SSEEvent, full: dict[str, object]) -> bool:
        if event.event in _REMEMBERED:
            completed = orjson.loads(event.data)
            response = completed.get("response") if isinstance(completed, dict) else None
            if isinstance(response, dict) and isinstance(response.get("id"), str):
                output = response.get("output")
                self._conversation.remember(
                    response["id"], full, output if isinstance(output, list) else []
                )
        return await self._event(event.data)

    async def _upstream_error(self, upstream: aiohttp.ClientResponse) -> None:
        """The chat upstream's error answer, as the API's error event on the socket."""
        status = upstream.status
        try:
            with upstream_failures(answering=True):
                raw = await upstream.read()
        except UpstreamFailure as failure:
            await self._failed(failure)
            return
        finally:
            upstream.release()
        turn = self._turns[0]
        parsed = load_json_object(raw)
        if turn.recorder is not None and context_length_exceeded(status, parsed):
            turn.recorder.context_exceeded()
        error = parsed.get("error") if parsed is not None else None
        if not isinstance(error, dict):
            message = error_message(parsed) if parsed is not None else None
            text = message or raw.decode("utf-8", errors="replace")
            error = {"type": "api_error", "code": None, "message": text, "param": None}
        await self._event(orjson.dumps({"type": ERROR, "status": status, "error": error}).decode())

    async def _local_error(self, status: int, code: str, message: str, reason: LocalReason) -> None:
        """The server answers the turn with an error event of its own, for ``reason``."""
        await self._event(error_event(status, code, message).decode(), local=reason)

    async def _failed(self, failure: UpstreamFailure) -> None:
        """No answer from the upstream: the turn's error event is the server's own."""
        turn = self._turns[0]
        if turn.recorder is not None and failure.category is not None:
            turn.recorder.upstream_failed(failure.category)
        reason = (
            LocalReason.UPSTREAM_TIMEOUT if failure.timed_out else LocalReason.UPSTREAM_UNREACHABLE
        )
        await self._local_error(failure.status, failure.kind, str(failure), reason)

    async def _prepare(self, full: dict[str, object]) -> None:
        """``generate: false``: the state is kept and nothing is generated or sent upstream."""
        response_id = f"resp_{new_model_call_id()}"
        self._conversation.remember(response_id, full, [])
        response = prepared_response(response_id, full, time.time())
        created = {"type": "response.created", "response": {**response, "status": "in_progress"}}
        completed = {"type": "response.completed", "response": response}
        await self._event(orjson.dumps(created).decode(), local=LocalReason.STATE_ONLY)
        await self._event(orjson.dumps(completed).decode(), local=LocalReason.STATE_ONLY)


# What a socket's tasks raise when a peer goes away (Starlette raises RuntimeError for a send
# after the close): the end of the socket, not a fault.
_GONE: Final = (OSError, aiohttp.ClientError, WebSocketDisconnect, RuntimeError)


def _unexpected(client: WebSocket, done: set[asyncio.Task[None]]) -> bool:
    """Whether a task of the socket ended on a fault of the server's own (it is logged)."""
    for task in done:
        exc = task.exception()
        if exc is not None and not isinstance(exc, _GONE):
            log.error(
                "WebSocket %s: %s: %s",
                client.scope.get("path"),
                type(exc).__name__,
                exc,
                exc_info=exc,
            )
            return True
    return False


_RESPONSES: Final = get_dialect("responses")
_REMEMBERED: Final = frozenset({"response.completed", "response.incomplete"})
_JSON: Final = "application/json"
_CT: Final = "content-type"
_WAITING_TURNS: Final = 8
# Turns sent and not yet answered on one pass-through socket, at most.
MAX_OPEN_TURNS: Final = 64


def _error_body(data: str) -> bytes:
    """An ``error`` event's answer as an HTTP call's error body: ``{"error": ...}``."""
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data.encode()
    if isinstance(event, dict) and isinstance(event.get("error"), dict):
        return orjson.dumps({"error": event["error"]})
    return data.encode()
