"""The fake upstream's Responses WebSocket mode: one socket's state and its answers (pure).

A socket to ``/v1/responses`` carries turns. Each starts with one client text message, a
``response.create`` event (a create body without ``stream`` and ``background``, plus its
``type``), and is answered with the events a streamed Responses call carries, in order, each as
one text message holding the event's JSON object (the SSE ``data`` payload, as is).

``ResponsesSocket`` holds what one socket remembers: the responses it completed (their full input
and their output), so that a turn that sends ``previous_response_id`` and only its new input items
is answered as the whole conversation sent over HTTP would be. Every turn is answered by
``_scenarios.answer`` on that full request, with ``"stream": true``: the same scenarios, knobs,
ids and events as the HTTP route. The shell (``_server``) carries a ``SocketReply`` out: the
waits, the close, the hang.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

import orjson

from rollcap.sse import SSEDecoder
from rollcap.testing._knobs import HEADER_SCENARIO
from rollcap.testing._scenarios import (
    ReplyKind,
    answer,
    error_reply,
    expected_response,
    is_authorized,
)

__all__ = ["CREATE", "DEFAULT_MAX_STORED", "ResponsesSocket", "SocketReply"]

CREATE: Final = "response.create"
STEER: Final = "response.steer"
DEFAULT_MAX_STORED: Final = 64

# Fields a create body has over HTTP that a socket turn does not: every turn is a stream, and
# ``generate`` is the socket's own.
_NOT_FORWARDED = frozenset({"type", "stream", "background", "generate"})
_TERMINAL = frozenset({"response.completed", "response.incomplete"})
_ZERO_USAGE: Final[Mapping[str, Any]] = {
    "input_tokens": 0,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 0,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 0,
}


@dataclass(frozen=True, slots=True)
class SocketReply:
    """What to do with one client message.

    ``messages``: the text messages to send, in order, ``chunk_delay_s`` apart, after waiting
    ``delay_s``. ``close``: then close the socket (a turn cut mid-way, or dropped without an
    answer). ``hang``: after the wait, send nothing more on this socket, ever. ``request``: the
    full Responses request the turn was answered as (``"stream": true``, the stored conversation
    before the new input); ``None`` when the message was refused before one was built.
    """

    messages: tuple[str, ...] = ()
    delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    close: bool = False
    hang: bool = False
    request: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)


@dataclass(frozen=True, slots=True)
class _Stored:
    """A response a later turn can continue from: its full input, then its output."""

    input: tuple[Any, ...]
    output: tuple[Any, ...]


class ResponsesSocket:
    """One Responses WebSocket's state: ``receive(message, request_id=...) -> SocketReply``.

    ``headers`` are the handshake's: its ``x-fake-*`` knobs (and ``authorization``, checked
    against ``api_key`` when one is given) apply to every turn; a turn's scenario may also come
    from its ``model``, as over HTTP. At most ``max_stored`` responses are kept to be continued
    from (the oldest is dropped first).

    A ``response.create`` is answered as ``POST /v1/responses`` with ``"stream": true`` answers
    the full request: its fields, with ``input`` the stored input and output of the
    ``previous_response_id`` (if any) followed by its own input items. Only input and output
    carry forward: ``instructions``, ``tools`` and every other field are the turn's own, as the
    API does it. ``stream`` and ``background`` are ignored. A turn whose last event is
    ``response.completed`` or ``response.incomplete`` is stored under its response id.

    ``generate: false`` stores the full request's input under a new response id (derived from
    the request, so the same on every run) without generating: ``response.created`` (status
    ``in_progress``) then ``response.completed`` (status ``completed``, empty ``output``, usage
    zeros). Scenarios and knobs do not apply to it.

    Scenarios map as follows: a stream is its events; ``truncate`` is the events so far, then
    ``close``; an error status (``http_<status>``, ``context_length``, a knob error, 401) is one
    ``{"type": "error", "status": <status>, "error": <the error body's "error">}``; ``hang`` is
    ``hang``; ``disconnect`` is ``close`` with no message; ``endless`` is refused with a 400
    error event (code ``unsupported_scenario``): a turn that never ends would hold the socket's
    queue forever. A message that is no ``response.create`` (not JSON: ``invalid_json``; not an
    object or without a string ``type``: ``invalid_event``; another ``type``:
    ``unknown_event_type``), a field of the wrong type (``invalid_type``) or an unknown
    ``previous_response_id`` (``previous_response_not_found``) gets a 400 error event of type
    ``invalid_request_error``. An error event never closes the socket.
    """

    def __init__(
        self,
        headers: Mapping[str, str],
        *,
        api_key: str | None = None,
        max_stored: int = DEFAULT_MAX_STORED,
    ) -> None:
        if max_stored < 1:
            raise ValueError(f"max_stored must be at least 1, got {max_stored}")
        self._headers = {name.lower(): value for name, value in headers.items()}
        self._api_key = api_key
        self._max_stored = max_stored
        self._stored: dict[str, _Stored] = {}  # oldest first

    @property
    def stored(self) -> tuple[str, ...]:
        """The ids of the responses a turn can continue from, oldest first."""
        return tuple(self._stored)

    def receive(self, message: str | bytes, *, request_id: str) -> SocketReply:
        """The answer to one client text message; ``request_id`` names the turn (as the HTTP
        route's ``x-request-id`` does; it appears in no Responses event)."""
        try:
            event = orjson.loads(message)
        except orjson.JSONDecodeError:
            return _invalid("invalid_json", "The message is not valid JSON.")
        if not isinstance(event, dict):
            return _invalid("invalid_event", "The message must be a JSON object (an event).")
        kind = event.get("type")
        if not isinstance(kind, str):
            return _invalid("invalid_event", "The event has no string 'type'.", "type")
        if self._api_key is not None and not is_authorized(
            "responses", self._headers, self._api_key
        ):
            return _error_reply(error_reply("responses", 401, request_id).body, 401)
        if kind == STEER:
            # Taken and not answered: the fake has no response to steer, and a client that
            # steers must not see an error the real API would not send.
            return SocketReply()
        if kind != CREATE:
            return _invalid(
                "unknown_event_type",
                f"Unknown event type {kind!r}: expected {CREATE!r}.",
                "type",
            )
        generate = event.get("generate", True)
        if not isinstance(generate, bool):
            return _invalid("invalid_type", "'generate' must be a boolean.", "generate")
        body = {key: value for key, value in event.items() if key not in _NOT_FORWARDED}
        previous_id = body.get("previous_response_id")
        if previous_id is not None:
            if not isinstance(previous_id, str):
                return _invalid(
                    "invalid_type",
                    "'previous_response_id' must be a string.",
                    "previous_response_id",
                )
            previous = self._stored.get(previous_id)
            if previous is None:
                return _invalid(
                    "previous_response_not_found",
                    f"Previous response with id '{previous_id}' not found.",
                    "previous_response_id",
                )
            new_items = _items(body.get("input"))
            if new_items is None:
                return _invalid(
                    "invalid_type", "'input' must be a string or a list of items.", "input"
                )
            body["input"] = [*previous.input, *previous.output, *new_items]
        # Without a previous response the body goes on as sent: the same request over HTTP
        # gets the same answer.
        body["stream"] = True
        if not generate:
            return self._prepare(body)
        return self._generate(body, request_id)

    def _generate(self, body: dict[str, Any], request_id: str) -> SocketReply:
        reply = answer(
            "responses",
            orjson.dumps(body),
            self._headers,
            request_id=request_id,
            api_key=self._api_key,
        )
        if reply.repeat:
            refusal = _invalid(
                "unsupported_scenario",
                "The endless scenario is not served over WebSocket: a turn that never ends "
                "would hold the socket forever.",
            )
            return replace(refusal, request=body)
        if reply.kind is ReplyKind.HANG:
            turn = SocketReply(hang=True)
        elif reply.kind is ReplyKind.DISCONNECT:
            turn = SocketReply(close=True)
        elif reply.kind is ReplyKind.BODY:
            turn = _error_reply(reply.body, reply.status)
        else:
            decoder = SSEDecoder()
            events = [event for frame in reply.events for event in decoder.feed(frame)]
            messages = tuple(event.data for event in [*events, *decoder.flush()])
            if not reply.cut:
                self._remember(body, messages)
            turn = SocketReply(messages, close=reply.cut)
        return replace(turn, delay_s=reply.delay_s, chunk_delay_s=reply.chunk_delay_s, request=body)

    def _prepare(self, body: dict[str, Any]) -> SocketReply:
        """``generate: false``: a response with this request's state and no output."""
        canonical = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
        # Its own id: the request generated would get the other one, from the same hash.
        digest = hashlib.sha256(b"generate-false\n" + canonical).hexdigest()
        # The response object a text answer would have, emptied: every field as the API sets it.
        shape = expected_response("responses", body, {HEADER_SCENARIO: "text"})
        response = {
            **shape,
            "id": f"resp_{digest[:48]}",
            "incomplete_details": None,
            "output": [],
        }
        created = {**response, "status": "in_progress", "usage": None}
        completed = {**response, "status": "completed", "usage": dict(_ZERO_USAGE)}
        messages = (
            _dumps({"type": "response.created", "sequence_number": 0, "response": created}),
            _dumps({"type": "response.completed", "sequence_number": 1, "response": completed}),
        )
        self._store(response["id"], _Stored(tuple(_items(body.get("input")) or ()), ()))
        return SocketReply(messages, request=body)

    def _remember(self, body: Mapping[str, Any], messages: tuple[str, ...]) -> None:
        """Store the turn's response when its last event completed it."""
        if not messages:
            return
        try:
            last = orjson.loads(messages[-1])
        except orjson.JSONDecodeError:
            return
        if not isinstance(last, dict) or last.get("type") not in _TERMINAL:
            return
        response = last.get("response")
        if not isinstance(response, dict) or not isinstance(response.get("id"), str):
            return
        output = response.get("output")
        self._store(
            response["id"],
            _Stored(
                tuple(_items(body.get("input")) or ()),
                tuple(output) if isinstance(output, list) else (),
            ),
        )

    def _store(self, response_id: str, stored: _Stored) -> None:
        self._stored.pop(response_id, None)  # stored again: now the newest
        self._stored[response_id] = stored
        while len(self._stored) > self._max_stored:
            del self._stored[next(iter(self._stored))]


def _items(value: object) -> list[Any] | None:
    """A create body's ``input`` as a list of items (a string is one user message; absent is
    none); ``None`` when it is neither."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list):
        return list(value)
    return None


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _error_event(status: int, error: Mapping[str, Any]) -> str:
    return _dumps({"type": "error", "status": status, "error": error})


def _invalid(code: str, message: str, param: str | None = None) -> SocketReply:
    """A 400 error event the socket survives."""
    error = {"type": "invalid_request_error", "code": code, "message": message, "param": param}
    return SocketReply((_error_event(400, error),))


def _error_reply(body: bytes, status: int) -> SocketReply:
    """An HTTP error answer as an error event: its status, and its body's ``error`` object."""
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:  # pragma: no cover - every error body of the fake is JSON
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict):  # pragma: no cover - every error body has its object
        error = {"type": "server_error", "code": None, "message": "Error.", "param": None}
    return SocketReply((_error_event(status, error),))
