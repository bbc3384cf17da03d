"""Incremental server-sent-events decoder and encoder (pure, no I/O).

The decoder follows the WHATWG event-stream parsing rules. It is fed arbitrary byte chunks, as they
come off a socket, and returns the events completed so far. Lines are cut in bytes and decoded only
once whole, so a chunk boundary inside a UTF-8 character or between the CR and LF of a CRLF costs
nothing special.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["SSEDecoder", "SSEEvent", "encode_event", "is_event_stream"]

_BOM = "\ufeff"
_BOM_BYTES = _BOM.encode()


class SSEEvent(NamedTuple):
    """One dispatched event. ``event`` is ``None`` when the stream named no type ("message").

    A named tuple, not a frozen dataclass: a captured stream makes one per event on the event
    loop, built once per event: keep it cheap.
    """

    data: str
    event: str | None = None
    id: str | None = None
    retry: int | None = None


# The tuple's own constructor, without the Python-level ``__new__`` the named tuple adds.
_new_event = tuple.__new__


class SSEDecoder:
    """``feed(chunk) -> events``; ``flush() -> events`` at end of stream.

    An event still pending when the stream ends without its blank line is *not* dispatched by
    ``flush`` unless ``dispatch_unterminated`` is true: per the standard it is incomplete, but a
    capture wants to see what arrived, so callers choose.
    """

    __slots__ = (
        "_buffer",
        "_data",
        "_event",
        "_has_data",
        "_id",
        "_last_id",
        "_pending_cr",
        "_retry",
        "_started",
    )

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._pending_cr = False
        self._started = False
        self._data: list[str] = []
        self._has_data = False
        self._event: str | None = None
        self._id: str | None = None
        self._last_id: str | None = None
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        if not chunk:
            return events
        if (
            not self._pending_cr
            and not self._has_data
            and self._event is None
            and self._id is None
            and self._retry is None
            and b"\r" not in chunk
        ):
            # No field of an event is pending, only bytes not parsed yet: whole events, as
            # servers send them, are cut at their blank lines, and each plain one (``data: X``,
            # or ``event: N`` then ``data: X``) is made in one step. The line-by-line path
            # takes over from the first event of another shape. The bytes of an event still
            # coming wait unparsed in the buffer for the next chunk. Every captured stream is
            # decoded on the event loop: this path keeps it cheap.
            data = bytes(self._buffer) + chunk if self._buffer else chunk
            if not self._started and len(data) >= len(_BOM_BYTES) and b"\r" not in data:
                # The stream's first bytes: a byte order mark there is dropped, once.
                self._started = True
                if data.startswith(_BOM_BYTES):
                    data = data[len(_BOM_BYTES) :]
            if self._started and b"\r" not in data:
                self._buffer.clear()
                blocks = data.split(b"\n\n")
                tail = blocks.pop()  # after the last blank line
                for i, block in enumerate(blocks):
                    event = self._plain_event(block)
                    if event is None:
                        self._lines(b"\n\n".join(blocks[i:]) + b"\n\n" + tail, events)
                        return events
                    events.append(event)
                self._buffer += tail
                return events
        self._lines(chunk, events)
        return events

    def _plain_event(self, block: bytes) -> SSEEvent | None:
        """The event of ``data: X`` or ``event: N`` + ``data: X``, blank line cut off; else None."""
        name: str | None = None
        if block.startswith(b"event: "):
            end = block.find(b"\n")
            if end == -1:
                return None
            name = block[7:end].decode("utf-8", errors="replace") or None
            block = block[end + 1 :]
        if not block.startswith(b"data: ") or b"\n" in block:
            return None
        data = block[6:].decode("utf-8", errors="replace")
        return _new_event(SSEEvent, (data, name, self._last_id, None))

    def _lines(self, chunk: bytes, events: list[SSEEvent]) -> None:
        """Parse every whole line of buffer + chunk; a last, unfinished line stays buffered."""
        buf = self._buffer
        start = 0
        if self._pending_cr:
            # The previous chunk ended in CR; an LF right here belongs to that line end.
            self._pending_cr = False
            if chunk[:1] == b"\n":
                start = 1
        buf += chunk[start:] if start else chunk
        if b"\r" not in buf:
            # The common case (LF only): one split instead of a search per line end.
            last = buf.rfind(b"\n")
            if last != -1:
                line = self._line
                for raw in buf[:last].split(b"\n"):
                    line(raw, events)
                del buf[: last + 1]
            return
        pos = 0
        n = len(buf)
        while pos < n:
            cr = buf.find(b"\r", pos)
            lf = buf.find(b"\n", pos)
            if cr == -1 and lf == -1:
                break
            if cr == -1 or (lf != -1 and lf < cr):
                end, nxt = lf, lf + 1
            elif cr == n - 1:
                # CR at the very end: the line is complete, but a following LF may be in the
                # next chunk and must not count as a second (blank) line.
                end, nxt = cr, cr + 1
                self._pending_cr = True
            elif buf[cr + 1] == 0x0A:
                end, nxt = cr, cr + 2
            else:
                end, nxt = cr, cr + 1
            self._line(bytes(buf[pos:end]), events)
            pos = nxt
        del buf[:pos]

    def flush(self, *, dispatch_unterminated: bool = False) -> list[SSEEvent]:
        """End of stream. Returns the pending event only when asked to (see class docstring)."""
        events: list[SSEEvent] = []
        if self._buffer:
            # Whole lines may wait here unparsed (see ``feed``); the last line lacks its end.
            pending = bytes(self._buffer)
            self._buffer.clear()
            self._lines(pending, events)
            if self._buffer:
                self._line(bytes(self._buffer), events)
                self._buffer.clear()
        if dispatch_unterminated:
            self._dispatch(events)
        self._reset_event()
        self._pending_cr = False
        return events

    @property
    def has_pending(self) -> bool:
        """True when bytes or fields of an unfinished event are held."""
        return bool(self._buffer) or self._has_data or self._event is not None

    def _line(self, raw: bytes | bytearray, events: list[SSEEvent]) -> None:
        if raw[:6] == b"data: " and self._started:
            # Nearly every line of a model stream: skip the general field parsing.
            self._data.append(raw[6:].decode("utf-8", errors="replace"))
            self._has_data = True
            return
        line = raw.decode("utf-8", errors="replace")
        if not self._started:
            self._started = True
            if line.startswith(_BOM):
                line = line[1:]
        if not line:
            self._dispatch(events)
            return
        if line[0] == ":":
            return
        field, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
            self._has_data = True
        elif field == "event":
            self._event = value
        elif field == "id":
            if "\x00" not in value:
                self._id = value
        elif field == "retry" and value.isascii() and value.isdigit():
            self._retry = int(value)
        # Unknown fields are ignored, as the standard says.

    def _dispatch(self, events: list[SSEEvent]) -> None:
        if self._id is not None:
            self._last_id = self._id
        if self._has_data:
            events.append(
                SSEEvent(
                    data="\n".join(self._data),
                    event=self._event or None,
                    id=self._last_id,
                    retry=self._retry,
                ),
            )
        self._reset_event()

    def _reset_event(self) -> None:
        self._data = []
        self._has_data = False
        self._event = None
        self._id = None
        self._retry = None


def encode_event(event: SSEEvent) -> bytes:
    """Serialize one event with LF line ends, each data line on its own ``data:`` field."""
    parts: list[str] = []
    if event.event is not None:
        _check_single_line("event", event.event)
        parts.append(f"event: {event.event}\n")
    if event.id is not None:
        _check_single_line("id", event.id)
        parts.append(f"id: {event.id}\n")
    if event.retry is not None:
        parts.append(f"retry: {event.retry}\n")
    for line in event.data.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        parts.append(f"data: {line}\n")
    parts.append("\n")
    return "".join(parts).encode("utf-8")


def _check_single_line(name: str, value: str) -> None:
    if "\n" in value or "\r" in value:
        raise ValueError(f"SSE {name} field must be a single line: {value!r}")


def is_event_stream(content_type: str | None) -> bool:
    """Whether a ``content-type`` value is ``text/event-stream``, in any case, parameters aside."""
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() == "text/event-stream"
