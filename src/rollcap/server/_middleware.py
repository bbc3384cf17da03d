"""Pure-ASGI capture middleware: strip the rollout prefix, record the call, hold the end back.

It wraps ``receive`` and ``send`` and never rebuilds the response: every message the app sends
goes out unchanged (one header added), in order. Only the timing changes for two messages: the
one that completes a stream's terminal event, and a non-streamed body, wait until the call's
record is durable.

It also reads every request body, once, for every route: the app finds it in the scope
(``request_body``), so it is held once and never copied per layer. A body longer than
``max_request_bytes``, declared so or found so as it comes, is answered 413 in the client's
dialect as soon as that is known, and the connection closed without reading the rest. A client
that hangs up before its body is whole is one log line (and, captured, a ``cancelled`` record).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rollcap._proxy.asgi import send_json
from rollcap._proxy.relay import break_off_on, quiet_deliberate_breaks, upstream_broke
from rollcap._runtime.memory import MemoryReleaser
from rollcap.config import CLIENT_SESSION_HEADERS, MAX_REQUEST_BYTES, LiveStatusSettings
from rollcap.dialects import openai_error
from rollcap.records import CAPTURE_MAX_RESPONSE_BYTES, GAP_CAPTURE_OVER_LIMIT
from rollcap.routing import strip_prefix
from rollcap.server._answers import error_body
from rollcap.server._fresh import new_model_call_id, now
from rollcap.server._inflight import HELD, NO_ERROR, WRITING, InflightCalls, OpenCall
from rollcap.server._recorder import CallFailure, CallRecorder, LocalReason
from rollcap.server._writer import RecordWriter
from rollcap.sse import is_event_stream
from rollcap.store import CaptureStore

__all__ = [
    "BODY_KEY",
    "DIALECT_ROUTES",
    "INFLIGHT_KEY",
    "RECORDER_KEY",
    "CaptureMiddleware",
    "CaptureState",
    "request_body",
]

log = logging.getLogger("rollcap.server")

DIALECT_ROUTES = {
    "/v1/responses": "responses",
    "/v1/chat/completions": "chat",
    "/v1/messages": "messages",
}
RECORDER_KEY = "rollcap.recorder"
# The middleware itself, in a WebSocket's scope: the socket's route records its turns through it.
CAPTURE_KEY = "rollcap.capture"
BODY_KEY = "rollcap.body"
# The call's OpenCall, for the forwarder to tell of the upstream's bytes.
INFLIGHT_KEY = "rollcap.inflight"
CALL_ID_HEADER = b"x-rollcap-model-call-id"
# A record built from up to this many bytes is built on the event loop, where it is cheapest (a
# stream of a few hundred events); a bigger one in a builder thread, in slices, two at a time.
BUILD_ON_LOOP_BYTES = 64 * 1024

# What a send to a client that went away raises, depending on the server and the response class.
_CLIENT_GONE = (asyncio.CancelledError, OSError, ClientDisconnect)


@dataclass(slots=True)
class CaptureState:
    """What the server knows across calls; ``/health`` reports the counters, ``/inflight`` the
    open calls."""

    server_name: str
    store: CaptureStore | None  # None: capture off
    live: LiveStatusSettings = field(default_factory=LiveStatusSettings)
    writer: RecordWriter | None = field(init=False)  # the store's, made with it
    inflight: InflightCalls = field(init=False)
    captured: int = 0
    uncorrelated: int = 0
    capture_failures: int = 0
    # Told of each dialect call once the server is done with it (the server's metrics).
    call_ended: Callable[[OpenCall], None] | None = None

    def __post_init__(self) -> None:
        self.writer = None if self.store is None else RecordWriter(self.store)
        self.inflight = InflightCalls(self.live)


async def request_body(request: Request) -> bytes | bytearray:
    """The request's body: the one the capture middleware read, else read now."""
    body: bytes | bytearray | None = request.scope.get(BODY_KEY)
    return await request.body() if body is None else body


class _TooLarge(Exception):
    """The request body is longer than ``max_request_bytes``."""


class _HungUp(Exception):
    """The client went away before its request body was whole."""

    def __init__(self, received: int) -> None:
        super().__init__(received)
        self.received = received


class CaptureMiddleware:
    """``max_request_bytes``: the longest request body taken; ``capture_max_response_bytes``:
    the most of one response a record keeps (``CallRecorder``)."""

    def __init__(
        self,
        app: ASGIApp,
        state: CaptureState,
        *,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        capture_max_response_bytes: int = CAPTURE_MAX_RESPONSE_BYTES,
        session_headers: Sequence[str] = CLIENT_SESSION_HEADERS,
    ) -> None:
        self.app = app
        self._session_headers = tuple(name.lower().encode("latin-1") for name in session_headers)
        self.state = state
        self.max_request_bytes = max_request_bytes
        self.capture_max_response_bytes = capture_max_response_bytes
        # Accounting for records whose callers were cancelled while they were written.
        self._late: set[asyncio.Task[None]] = set()
        self._releaser = MemoryReleaser()
        quiet_deliberate_breaks()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._socket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await break_off_on(self._route, scope, receive, send, log)

    async def _socket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket: its prefix stripped as a call's is; the socket's route records its
        turns through this middleware (``_socket``)."""
        try:
            _, scope = strip_prefix(scope)
        except ValueError as exc:
            log.info("WebSocket %s refused: %s", scope.get("path"), exc)
            await send({"type": "websocket.close", "code": 1008, "reason": str(exc)[:120]})
            return
        await self.app({**scope, CAPTURE_KEY: self}, receive, send)

    def session_id(self, scope: Scope) -> str | None:
        """The first configured session header the request carries (the last value of a
        repeated one, as before)."""
        found: dict[bytes, bytes] = {}
        for name, value in scope.get("headers", ()):
            if name in self._session_headers:
                found[name] = value
        for name in self._session_headers:
            if name in found:
                return found[name].decode("latin-1")
        return None

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            rollout_id, scope = strip_prefix(scope)
        except ValueError as exc:
            await send_json(send, 400, orjson.dumps(openai_error(str(exc))))
            return
        dialect = DIALECT_ROUTES.get(scope["path"]) if scope["method"] == "POST" else None
        if dialect is None:
            await self._serve(rollout_id, None, scope, receive, send)
            return
        clock = now()
        inflight = self.state.inflight.open(
            rollout_id, dialect, started_at=clock.wall, started=clock.mono
        )
        try:
            await self._serve(
                rollout_id, inflight, {**scope, INFLIGHT_KEY: inflight}, receive, send
            )
        finally:
            self.state.inflight.close(inflight, time.monotonic())
            if self.state.call_ended is not None:
                self.state.call_ended(inflight)

    async def _serve(
        self,
        rollout_id: str | None,
        inflight: OpenCall | None,  # None: not a dialect call
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        dialect = None
        if inflight is not None:
            dialect = inflight.dialect
            send = _counted(send, inflight)
            receive = _watched(receive, inflight)
        writer = self.state.writer  # None: capture off
        if dialect is not None and rollout_id is None:
            self.state.uncorrelated += 1
        if dialect is None or rollout_id is None or writer is None:
            try:
                body = await self._read_body(scope, receive)
            except _TooLarge:
                await self._refuse(send, dialect)
                return
            except _HungUp as gone:
                self._hung_up(scope, gone)
                return
            if body is not None:
                scope, receive = {**scope, BODY_KEY: body}, _replay(body, receive)
            await self.app(scope, receive, send)
            return
        session_id = self.session_id(scope)
        recorder = CallRecorder(
            model_call_id=new_model_call_id(),
            dialect=dialect,
            server_name=self.state.server_name,
            start=now(),
            client_session_id=session_id,
            max_response_bytes=self.capture_max_response_bytes,
        )
        if inflight is not None:
            inflight.model_call_id = recorder.model_call_id
        call = _CapturedCall(self, writer, rollout_id, recorder, receive, send, inflight)
        try:
            body = await self._read_body(scope, receive)
        except _TooLarge:
            recorder.gap(
                GAP_CAPTURE_OVER_LIMIT,
                f"request: over max_request_bytes={self.max_request_bytes}, answered 413 and "
                "not kept",
            )
            recorder.answered_locally(LocalReason.INVALID_REQUEST)
            await self._refuse(call.send, dialect)
            return
        except _HungUp as gone:
            self._hung_up(scope, gone)
            call.client_gone = True
            await call.returned()
            return
        if body is not None:
            recorder.request(body)
            scope = {**scope, BODY_KEY: body}
            call.replay(body)
        try:
            await self.app({**scope, RECORDER_KEY: recorder}, call.receive, call.send)
        except BaseException as exc:
            await call.raised(exc)
            raise
        await call.returned()

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | bytearray | None:
        """The whole request body, or None for a request that declares none.

        ``_TooLarge`` as soon as it is known to pass ``max_request_bytes`` (its declared length
        first), without reading more; ``_HungUp`` when the client goes away first. A body that
        comes in one message is kept as it came; one in many grows in one buffer.
        """
        limit = self.max_request_bytes
        declared: int | None = None
        chunked = False
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = None
            elif name == b"transfer-encoding":
                chunked = True
        if declared is None and not chunked:
            return None  # HTTP/1.1: no length, not chunked, no body
        if declared is not None and declared > limit:
            raise _TooLarge
        message = await receive()
        if message["type"] != "http.request":
            raise _HungUp(0)
        first: bytes = message.get("body", b"")
        if len(first) > limit:
            raise _TooLarge
        if not message.get("more_body", False):
            return first
        body = bytearray(first)
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise _HungUp(len(body))
            chunk = message.get("body", b"")
            if len(body) + len(chunk) > limit:
                raise _TooLarge
            body += chunk
            if not message.get("more_body", False):
                return body

    async def _refuse(self, send: Send, dialect: str | None) -> None:
        """413 in the client's dialect, at once: the server drops a little more of the body,
        so that a client still sending can read it, then closes the connection
        (``rollcap._runtime.serving``); the rest of the body is never read."""
        message = f"the request body is longer than max_request_bytes ({self.max_request_bytes})"
        kind = "request_too_large" if dialect == "messages" else "invalid_request_error"
        body = error_body(dialect, kind, message)
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", b"%d" % len(body)),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    def _hung_up(scope: Scope, gone: _HungUp) -> None:
        log.info(
            "%s %s: the client hung up before its request body was whole (%d bytes in)",
            scope.get("method"),
            scope.get("path"),
            gone.received,
        )

    async def write(
        self,
        writer: RecordWriter,
        rollout_id: str,
        recorder: CallRecorder,
        inflight: OpenCall | None = None,
    ) -> None:
        """Build the record and wait until the writer thread made it durable (``inflight``'s
        phases say which); a failure is logged only.

        A caller cancelled meanwhile (the client went away, the server stops) leaves at once,
        and its record is written all the same: it is queued already, and its outcome is
        accounted for when it comes.
        """
        call_id = recorder.model_call_id
        kept = recorder.kept_bytes
        if inflight is not None:
            inflight.phase = WRITING
        try:
            if kept <= BUILD_ON_LOOP_BYTES:
                # A small record is built here, on the event loop: the GIL serialises the work
                # with a thread either way, and a hand-off to one costs more than the build.
                record = recorder.record()
                if inflight is not None:
                    inflight.error_category = record["error_category"] or NO_ERROR
                durable = writer.submit(rollout_id, record)
                del record
                recorder.release()
            else:
                # A big one would stop the loop for as long as it takes: it is built in a
                # thread, a slice at a time, so the loop runs between slices.
                durable = writer.submit_built(rollout_id, _noting(recorder, inflight))
        except Exception as exc:
            await self._failed(writer, rollout_id, call_id, exc)
            return
        # Once the record is written, what the call kept can go back to the system.
        durable.add_done_callback(lambda _: self._releaser.note(kept))
        if inflight is not None:
            inflight.phase = HELD
        try:
            await asyncio.shield(durable)
        except asyncio.CancelledError:
            late = asyncio.ensure_future(self._settle(durable, writer, rollout_id, call_id))
            self._late.add(late)
            late.add_done_callback(self._late.discard)
            raise
        except Exception:
            pass  # settled below, as a success is
        await self._settle(durable, writer, rollout_id, call_id)

    async def _settle(
        self, durable: asyncio.Future[None], writer: RecordWriter, rollout_id: str, call_id: str
    ) -> None:
        """Count the record once it is durable, or report its failure."""
        try:
            await durable
        except Exception as exc:
            await self._failed(writer, rollout_id, call_id, exc)
        else:
            self.state.captured += 1

    async def _failed(
        self, writer: RecordWriter, rollout_id: str, call_id: str, exc: Exception
    ) -> None:
        """Count and log a record that could not be made durable; leave the rollout's marker."""
        self.state.capture_failures += 1
        log.error(
            "capture write failed for rollout %s call %s: %s: %s",
            rollout_id,
            call_id,
            type(exc).__name__,
            getattr(exc, "strerror", None) or exc,
        )
        try:
            await anyio.to_thread.run_sync(writer.store.mark_incomplete, rollout_id)
        except Exception as marker_exc:
            log.error(
                "could not leave the incomplete marker for rollout %s: %s",
                rollout_id,
                getattr(marker_exc, "strerror", None) or marker_exc,
            )


class _CapturedCall:
    """One captured call between the app and the client (Starlette's responder shape).

    ``receive`` and ``send`` wrap the client's and feed the recorder; the call ends in
    ``send`` (the end of the answer), ``raised`` or ``returned``, each writing the one record.
    Every message goes out unchanged and in order; two wait in ``held`` until the record is
    durable: the one that completes a stream's terminal event, and a non-streamed answer (its
    start too: one write to the client instead of two, the second an fsync later).
    """

    __slots__ = (
        "_capture",
        "_client_receive",
        "_client_send",
        "_held",
        "_inflight",
        "_rollout_id",
        "_writer",
        "client_gone",
        "recorder",
    )

    def __init__(
        self,
        capture: CaptureMiddleware,
        writer: RecordWriter,
        rollout_id: str,
        recorder: CallRecorder,
        receive: Receive,
        send: Send,
        inflight: OpenCall | None = None,
    ) -> None:
        self._capture = capture
        self._inflight = inflight
        self._writer = writer
        self._rollout_id = rollout_id
        self.recorder = recorder
        self._client_receive = receive
        self._client_send = send
        self._held: list[Message] = []
        self.client_gone = False

    def replay(self, body: bytes | bytearray) -> None:
        """The body was read already: the app's first ``receive`` gets it whole."""
        self._client_receive = _replay(body, self._client_receive)

    async def receive(self) -> Message:
        message = await self._client_receive()
        if message["type"] == "http.disconnect":
            self.client_gone = True
        return message

    async def send(self, message: Message) -> None:
        recorder = self.recorder
        kind = message["type"]
        if kind == "http.response.start":
            headers = message.get("headers", [])
            # The recorder reads the content type alone: the other headers are not decoded.
            # The last one wins, as it would in a mapping of them all.
            content_type = None
            for name, value in headers:
                if name.lower() == b"content-type":
                    content_type = value
            recorder.response_start(
                message["status"],
                {} if content_type is None else {"content-type": content_type.decode("latin-1")},
            )
            message = {
                **message,
                "headers": [*headers, (CALL_ID_HEADER, recorder.model_call_id.encode())],
            }
            await self._pass(message)
            return
        if kind != "http.response.body" or recorder.finished:
            await self._client_send(message)
            return
        terminal = recorder.body(message.get("body", b""))
        if message.get("more_body", False) and not terminal:
            await self._pass(message)
            return
        recorder.finish(now())
        await self._write()
        self._held.append(message)
        await self._release()

    async def raised(self, exc: BaseException) -> None:
        """The app raised: the call's record, then what upstream sent before it broke off."""
        broke = upstream_broke(exc)
        if not self.recorder.finished:
            failure: CallFailure | None
            if broke:
                failure = None  # upstream's doing: the record says truncated / unparseable
            elif self.client_gone or isinstance(exc, _CLIENT_GONE):
                failure = CallFailure.CANCELLED
            else:
                failure = CallFailure.EXCEPTION
            self.recorder.finish(now(), failure)
            await self._write()
        if self._held and broke and not self.client_gone:
            # Upstream cut its answer short: the client gets what upstream sent before the
            # break, as it would without capture, then the same broken connection.
            with contextlib.suppress(OSError, ClientDisconnect):
                await self._release()

    async def returned(self) -> None:
        """The app returned: a body left unfinished means the client went away (a streaming
        response stops when it hears the disconnect) or the app never answered."""
        if self.recorder.finished:
            return
        failure = CallFailure.CANCELLED if self.client_gone else CallFailure.EXCEPTION
        self.recorder.finish(now(), failure)
        await self._write()
        if self._held and not self.client_gone:
            await self._release()

    async def _pass(self, message: Message) -> None:
        """A stream's message goes out now; a non-streamed answer's waits for its end."""
        if self.recorder.streaming:
            await self._client_send(message)
        else:
            self._held.append(message)

    async def _write(self) -> None:
        await self._capture.write(self._writer, self._rollout_id, self.recorder, self._inflight)

    async def _release(self) -> None:
        held, self._held = self._held, []
        for message in held:
            await self._client_send(message)


def _noting(recorder: CallRecorder, inflight: OpenCall | None) -> Callable[[], dict[str, Any]]:
    """``recorder.record_in_slices``, telling ``inflight`` the record's error category."""

    def build() -> dict[str, Any]:
        record = recorder.record_in_slices()
        if inflight is not None:
            inflight.error_category = record.get("error_category") or NO_ERROR
        return record

    return build


def _counted(send: Send, call: OpenCall) -> Send:
    """``send``, telling ``call`` what went to the client, when the client took it, and when
    the client could not be reached any more."""

    async def counted(message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            content_type = next(
                (v for k, v in message.get("headers", ()) if k.lower() == b"content-type"), b""
            )
            call.answer_started(message["status"], is_event_stream(content_type.decode("latin-1")))
        try:
            await send(message)
        except _CLIENT_GONE:
            call.client_left(time.monotonic())
            raise
        if kind == "http.response.body":
            call.client(
                time.monotonic(),
                len(message.get("body", b"")),
                last=not message.get("more_body", False),
            )

    return counted


def _watched(receive: Receive, call: OpenCall) -> Receive:
    """``receive``, telling ``call`` when the client goes away."""

    async def watched() -> Message:
        message = await receive()
        if message["type"] == "http.disconnect":
            call.client_left(time.monotonic())
        return message

    return watched


def _replay(body: bytes | bytearray, receive: Receive) -> Receive:
    """``receive`` for an app whose request body was read already: the body first, whole, then
    what the client sends (its disconnect)."""
    pending = True

    async def replayed() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
