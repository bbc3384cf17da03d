"""Pure-ASGI capture middleware: strip the rollout prefix, record the call, hold the end back.

It wraps ``receive`` and ``send`` and never rebuilds the response: every message the app sends
goes out unchanged (one header added), in order. Only the timing changes for two messages: the
one that completes a stream's terminal event, and a non-streamed body, wait until the call's
record is durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

import anyio
import anyio.to_thread
import orjson
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rollcap._proxy.asgi import send_json
from rollcap._proxy.relay import break_off_on, quiet_deliberate_breaks, upstream_broke
from rollcap.dialects import openai_error
from rollcap.records import new_model_call_id
from rollcap.routing import strip_prefix
from rollcap.server._recorder import CallFailure, CallRecorder, Clock
from rollcap.server._writer import RecordWriter
from rollcap.store import CaptureStore

__all__ = ["DIALECT_ROUTES", "RECORDER_KEY", "CaptureMiddleware", "CaptureState"]

log = logging.getLogger("rollcap.server")

DIALECT_ROUTES = {
    "/v1/responses": "responses",
    "/v1/chat/completions": "chat",
    "/v1/messages": "messages",
}
RECORDER_KEY = "rollcap.recorder"
CALL_ID_HEADER = b"x-rollcap-model-call-id"

# What a send to a client that went away raises, depending on the server and the response class.
_CLIENT_GONE = (asyncio.CancelledError, OSError, ClientDisconnect)


@dataclass(slots=True)
class CaptureState:
    """What the server knows across calls; ``/health`` reports the counters."""

    server_name: str
    store: CaptureStore | None  # None: capture off
    writer: RecordWriter | None = field(init=False)  # the store's, made with it
    captured: int = 0
    uncorrelated: int = 0
    capture_failures: int = 0

    def __post_init__(self) -> None:
        self.writer = None if self.store is None else RecordWriter(self.store)


def _now() -> Clock:
    return Clock(time.time(), time.monotonic())


async def _send_all(send: Send, held: list[Message]) -> None:
    messages = held[:]
    held.clear()
    for message in messages:
        await send(message)


class CaptureMiddleware:
    def __init__(self, app: ASGIApp, state: CaptureState) -> None:
        self.app = app
        self.state = state
        # Accounting for records whose callers were cancelled while they were written.
        self._late: set[asyncio.Task[None]] = set()
        quiet_deliberate_breaks()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await break_off_on(self._route, scope, receive, send, log)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            rollout_id, scope = strip_prefix(scope)
        except ValueError as exc:
            await send_json(send, 400, orjson.dumps(openai_error(str(exc))))
            return
        dialect = DIALECT_ROUTES.get(scope["path"]) if scope["method"] == "POST" else None
        if dialect is None:
            await self.app(scope, receive, send)
            return
        if rollout_id is None:
            self.state.uncorrelated += 1
            await self.app(scope, receive, send)
            return
        if self.state.writer is None:  # capture off
            await self.app(scope, receive, send)
            return
        await self._capture(scope, receive, send, rollout_id, dialect, self.state.writer)

    async def _capture(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        rollout_id: str,
        dialect: str,
        writer: RecordWriter,
    ) -> None:
        session_id = None
        for name, value in scope.get("headers", ()):
            if name == b"x-session-id":
                session_id = value.decode("latin-1")
        recorder = CallRecorder(
            model_call_id=new_model_call_id(),
            dialect=dialect,
            server_name=self.state.server_name,
            start=_now(),
            client_session_id=session_id,
        )
        scope = {**scope, RECORDER_KEY: recorder}
        request_chunks: list[bytes] = []
        client_gone = False
        held: list[Message] = []

        async def capture_receive() -> Message:
            nonlocal client_gone
            message: Message = await receive()
            if message["type"] == "http.request":
                request_chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    recorder.request(b"".join(request_chunks))
            elif message["type"] == "http.disconnect":
                client_gone = True
            return message

        async def capture_send(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                headers = message.get("headers", [])
                recorder.response_start(
                    message["status"],
                    {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers},
                )
                message = {
                    **message,
                    "headers": [*headers, (CALL_ID_HEADER, recorder.model_call_id.encode())],
                }
                if recorder.streaming:
                    await send(message)
                else:
                    # Held with the body: one write to the client instead of two, the second
                    # an fsync later (bench/proxy.py: 15-20% less client CPU per call).
                    held.append(message)
                return
            if kind != "http.response.body" or recorder.finished:
                await send(message)
                return
            terminal = recorder.body(message.get("body", b""))
            more = message.get("more_body", False)
            if more and not terminal:
                if recorder.streaming:
                    await send(message)
                else:
                    held.append(message)
                return
            recorder.finish(_now())
            await self._write(writer, rollout_id, recorder)
            held.append(message)
            await _send_all(send, held)

        try:
            await self.app(scope, capture_receive, capture_send)
        except BaseException as exc:
            if not recorder.finished:
                failure: CallFailure | None
                if upstream_broke(exc):
                    failure = None  # upstream's doing: the record says truncated / unparseable
                elif client_gone or isinstance(exc, _CLIENT_GONE):
                    failure = CallFailure.CANCELLED
                else:
                    failure = CallFailure.EXCEPTION
                recorder.finish(_now(), failure)
                await self._write(writer, rollout_id, recorder)
            if held and upstream_broke(exc) and not client_gone:
                # Upstream cut its answer short: the client gets what upstream sent before
                # the break, as it would without capture, then the same broken connection.
                with contextlib.suppress(OSError, ClientDisconnect):
                    await _send_all(send, held)
            raise
        if not recorder.finished:
            # The app returned without finishing the body: the client went away (a streaming
            # response stops when it hears the disconnect) or the app never answered.
            failure = CallFailure.CANCELLED if client_gone else CallFailure.EXCEPTION
            recorder.finish(_now(), failure)
            await self._write(writer, rollout_id, recorder)
            if held and not client_gone:
                await _send_all(send, held)

    async def _write(self, writer: RecordWriter, rollout_id: str, recorder: CallRecorder) -> None:
        """Build the record and wait until the writer thread made it durable; a failure is
        logged only.

        A caller cancelled meanwhile (the client went away, the server stops) leaves at once,
        and its record is written all the same: it is queued already, and its outcome is
        accounted for when it comes. (An anyio shield kept the caller waiting instead, for
        15-25 us more per call: bench/proxy.py.)
        """
        call_id = recorder.model_call_id
        try:
            # Built here, not in the thread: the GIL serialises the work either way, and a
            # worker thread holding it makes the event loop wait for it back
            # (bench/proxy.py: streams +10-15% calls/s this way).
            durable = writer.submit(rollout_id, recorder.record())
        except Exception as exc:
            await self._failed(writer, rollout_id, call_id, exc)
            return
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
