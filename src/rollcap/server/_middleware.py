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
from dataclasses import dataclass, field

import anyio
import anyio.to_thread
import orjson
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rollcap._proxy.asgi import send_json
from rollcap._proxy.relay import break_off_on, quiet_deliberate_breaks, upstream_broke
from rollcap.dialects import openai_error
from rollcap.routing import strip_prefix
from rollcap.server._fresh import new_model_call_id, now
from rollcap.server._recorder import CallFailure, CallRecorder
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
        session_id = None
        for name, value in scope.get("headers", ()):
            if name == b"x-session-id":
                session_id = value.decode("latin-1")
        recorder = CallRecorder(
            model_call_id=new_model_call_id(),
            dialect=dialect,
            server_name=self.state.server_name,
            start=now(),
            client_session_id=session_id,
        )
        call = _CapturedCall(self, self.state.writer, rollout_id, recorder, receive, send)
        try:
            await self.app({**scope, RECORDER_KEY: recorder}, call.receive, call.send)
        except BaseException as exc:
            await call.raised(exc)
            raise
        await call.returned()

    async def write(self, writer: RecordWriter, rollout_id: str, recorder: CallRecorder) -> None:
        """Build the record and wait until the writer thread made it durable; a failure is
        logged only.

        A caller cancelled meanwhile (the client went away, the server stops) leaves at once,
        and its record is written all the same: it is queued already, and its outcome is
        accounted for when it comes.
        """
        call_id = recorder.model_call_id
        try:
            # Built here, on the event loop, not in the writer thread: the GIL serialises the
            # work either way, and a thread holding it makes the loop wait for it back. It is
            # built once per call on the loop: keep it cheap.
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
        "_request",
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
    ) -> None:
        self._capture = capture
        self._writer = writer
        self._rollout_id = rollout_id
        self.recorder = recorder
        self._client_receive = receive
        self._client_send = send
        self._request: list[bytes] = []
        self._held: list[Message] = []
        self.client_gone = False

    async def receive(self) -> Message:
        message = await self._client_receive()
        if message["type"] == "http.request":
            self._request.append(message.get("body", b""))
            if not message.get("more_body", False):
                self.recorder.request(b"".join(self._request))
        elif message["type"] == "http.disconnect":
            self.client_gone = True
        return message

    async def send(self, message: Message) -> None:
        recorder = self.recorder
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
        await self._capture.write(self._writer, self._rollout_id, self.recorder)

    async def _release(self) -> None:
        held, self._held = self._held, []
        for message in held:
            await self._client_send(message)
