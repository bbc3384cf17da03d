"""The events of a Responses WebSocket, as the model server reads them (pure).

On a socket to ``/v1/responses`` each turn starts with a client event ``response.create``
(a create body, without ``stream`` and ``background``, plus its ``type``) and is answered with
the events a Responses stream carries, one JSON object per text message. The capture keeps a
turn as it keeps an HTTP stream: the request is the event's body without its ``type``, and the
events go into the record's ``response_raw`` in the SSE text form (``event: <type>`` and
``data: <the message>``), so that every reader of stream records reads a turn unchanged.

Here: reading a client message (``read_client_event``), reading a server message
(``read_server_event``), an event's SSE frame (``sse_frame``), the error event the server sends
itself (``error_event``), and which events come before the answer's first output
(``BEFORE_OUTPUT``, for the time to first token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

__all__ = [
    "BEFORE_OUTPUT",
    "CREATE",
    "ERROR",
    "ClientEvent",
    "ServerEvent",
    "SocketEventError",
    "error_event",
    "read_client_event",
    "read_server_event",
    "sse_frame",
]

CREATE: Final = "response.create"
ERROR: Final = "error"
# A turn's events that say it started rather than what it answers: the time to first token runs
# to the first event after them.
BEFORE_OUTPUT: Final = frozenset({"response.created", "response.queued", "response.in_progress"})


class SocketEventError(ValueError):
    """A client message that is no event: not a JSON object, or without a string ``type``."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class ClientEvent:
    """One client event: its ``type``, the event as sent, and for a ``response.create`` its
    body (the event without ``type``, encoded: the turn's request)."""

    type: str
    event: dict[str, Any]
    body: bytes | None


@dataclass(frozen=True, slots=True)
class ServerEvent:
    """One server event: its ``type`` (``None`` for a message that is no JSON object with one)
    and, for an ``error`` event, its ``status`` (``None`` when it gives none)."""

    type: str | None
    status: int | None = None


def read_client_event(data: str | bytes) -> ClientEvent:
    """The client event in one text message; ``SocketEventError`` when it is none."""
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SocketEventError(f"the message is not JSON: {exc}", "invalid_json") from None
    if not isinstance(event, dict):
        raise SocketEventError("the message must be a JSON object (an event)", "invalid_event")
    kind = event.get("type")
    if not isinstance(kind, str):
        raise SocketEventError("the event has no string 'type'", "invalid_event")
    body = None
    if kind == CREATE:
        body = orjson.dumps({key: value for key, value in event.items() if key != "type"})
    return ClientEvent(kind, event, body)


_TYPE_FIRST = '{"type":"'


def read_server_event(data: str | bytes) -> ServerEvent:
    """What the capture needs of one server message: its type, and an error's status."""
    if isinstance(data, str) and data.startswith(_TYPE_FIRST):
        # The APIs write the type first: read it without parsing the whole event (the recorder
        # parses it once, as it reassembles). A type with an escape in it is read the long way.
        end = data.find('"', len(_TYPE_FIRST))
        first = data[len(_TYPE_FIRST) : end]
        if end > 0 and "\\" not in first and first != ERROR:
            return ServerEvent(first)
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        return ServerEvent(None)
    if not isinstance(event, dict):
        return ServerEvent(None)
    kind = event.get("type")
    if not isinstance(kind, str):
        return ServerEvent(None)
    status = event.get("status")
    if kind == ERROR and isinstance(status, int) and not isinstance(status, bool):
        return ServerEvent(kind, status)
    return ServerEvent(kind)


def sse_frame(kind: str | None, data: str | bytes) -> bytes:
    """The message as a stream record holds it: one SSE event (a message with line breaks in
    it keeps them as ``data:`` lines, which is how SSE carries them)."""
    text = data.encode() if isinstance(data, str) else data
    head = b"" if kind is None else b"event: " + kind.encode() + b"\n"
    if b"\n" not in text and b"\r" not in text:  # an event as the APIs write one: one line
        return b"%sdata: %s\n\n" % (head, text)
    lines = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    return head + b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"


def error_event(status: int, code: str, message: str, param: str | None = None) -> bytes:
    """An ``error`` event, as the Responses API sends one on a socket."""
    error: dict[str, Any] = {"type": "invalid_request_error", "code": code, "message": message}
    error["param"] = param
    return orjson.dumps({"type": ERROR, "status": status, "error": error})
