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


def _joined(pieces: list[bytes]) -> bytes:
    """The one place a line's pieces are put together (once per line)."""
    return b"".join(pieces)


def _line_length(chunk: bytes) -> int:
    """Bytes before the first CR or LF of ``chunk`` (which has one)."""
    cr = chunk.find(b"\r")
    lf = chunk.find(b"\n")
    return lf if cr == -1 else cr if lf == -1 else min(cr, lf)


class SSEDecoder:
    """``feed(chunk) -> events``; ``flush() -> events`` at end of stream.

    An event still pending when the stream ends without its blank line is *not* dispatched by
    ``flush`` unless ``dispatch_unterminated`` is true: per the standard it is incomplete, but a
    capture wants to see what arrived, so callers choose.

    Linear in the bytes fed, however long a line: the bytes of a line still coming are kept in
    the pieces they came in and joined once, when its end arrives, and a chunk is searched only
    for its own line ends. ``max_line``: a line still unfinished at the end of a chunk is held up
    to that many bytes; one that grows past it is dropped whole, its line end with it (its bytes
    are let go as they come; ``dropped_lines`` counts such lines), so what the decoder holds
    stays bounded whatever a stream sends.
    """

    __slots__ = (
        "_data",
        "_event",
        "_has_data",
        "_held",
        "_id",
        "_last_id",
        "_max_line",
        "_pending_cr",
        "_pieces",
        "_retry",
        "_skipping",
        "_started",
        "dropped_lines",
    )

    def __init__(self, *, max_line: int | None = None) -> None:
        # The unfinished last line, in the pieces it came in (never a whole line: those are
        # parsed as soon as their end arrives).
        self._pieces: list[bytes] = []
        self._held = 0
        self._max_line = max_line
        self._skipping = False  # inside a line past ``max_line``: dropped up to its end
        self.dropped_lines = 0
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
        if self._pending_cr:
            # The previous chunk ended in CR; an LF right here belongs to that line end.
            self._pending_cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
                if not chunk:
                    return events
        if b"\n" not in chunk and b"\r" not in chunk:
            # The unfinished line grows; nothing else is looked at.
            self._hold(chunk)
            return events
        if self._skipping or (
            self._pieces
            and self._max_line is not None
            and self._held + _line_length(chunk) > self._max_line
        ):
            # The line too long to keep ends in this chunk: it goes, its line end with it.
            if not self._skipping:
                self.dropped_lines += 1
            self._skipping = False
            self._pieces = []
            self._held = 0
            return self.feed(self._after_first_line(chunk))
        if self._pieces:
            data = _joined([*self._pieces, chunk])
            self._pieces = []
            self._held = 0
        else:
            data = chunk
        if (
            not self._has_data
            and self._event is None
            and self._id is None
            and self._retry is None
            and b"\r" not in data
        ):
            # No field of an event is pending: whole events, as servers send them, are cut at
            # their blank lines, and each plain one (``data: X``, or ``event: N`` then
            # ``data: X``) is made in one step. The line-by-line path takes over from the first
            # event of another shape, and for what follows the last blank line. Every captured
            # stream is decoded on the event loop: this path keeps it cheap.
            if not self._started and len(data) >= len(_BOM_BYTES):
                # The stream's first bytes: a byte order mark there is dropped, once.
                self._started = True
                if data.startswith(_BOM_BYTES):
                    data = data[len(_BOM_BYTES) :]
            if self._started:
                blocks = data.split(b"\n\n")
                tail = blocks.pop()  # after the last blank line
                for i, block in enumerate(blocks):
                    event = self._plain_event(block)
                    if event is None:
                        self._lines(b"\n\n".join(blocks[i:]) + b"\n\n" + tail, events)
                        return events
                    events.append(event)
                if tail:
                    self._lines(tail, events)
                return events
        self._lines(data, events)
        return events

    def _hold(self, piece: bytes) -> None:
        """Keep a piece of the unfinished line, unless the line is too long to keep."""
        if self._skipping:
            return
        self._held += len(piece)
        if self._max_line is not None and self._held > self._max_line:
            self._pieces = []
            self._held = 0
            self._skipping = True
            self.dropped_lines += 1
            return
        self._pieces.append(piece)

    def _after_first_line(self, chunk: bytes) -> bytes:
        """What follows the first line end of ``chunk`` (which has one)."""
        cr = chunk.find(b"\r")
        lf = chunk.find(b"\n")
        if cr == -1 or (lf != -1 and lf < cr):
            return chunk[lf + 1 :]
        if cr == len(chunk) - 1:
            self._pending_cr = True
            return b""
        return chunk[cr + 2 :] if chunk[cr + 1] == 0x0A else chunk[cr + 1 :]

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

    def _lines(self, data: bytes, events: list[SSEEvent]) -> None:
        """Parse every whole line of ``data``; a last, unfinished line is held for later."""
        line = self._line
        if b"\r" not in data:
            # The common case (LF only): one split instead of a search per line end.
            lines = data.split(b"\n")
            rest = lines.pop()
            for raw in lines:
                line(raw, events)
            if rest:
                self._hold(rest)
            return
        pos = 0
        n = len(data)
        # The next CR and LF at or after ``pos``, each searched for again only once passed:
        # a search per line from ``pos`` to the end would be quadratic in a chunk's lines.
        cr = data.find(b"\r")
        lf = data.find(b"\n")
        while pos < n:
            if cr != -1 and cr < pos:
                cr = data.find(b"\r", pos)
            if lf != -1 and lf < pos:
                lf = data.find(b"\n", pos)
            if cr == -1 and lf == -1:
                break
            if cr == -1 or (lf != -1 and lf < cr):
                end, nxt = lf, lf + 1
            elif cr == n - 1:
                # CR at the very end: the line is complete, but a following LF may be in the
                # next chunk and must not count as a second (blank) line.
                end, nxt = cr, cr + 1
                self._pending_cr = True
            elif data[cr + 1] == 0x0A:
                end, nxt = cr, cr + 2
            else:
                end, nxt = cr, cr + 1
            line(data[pos:end], events)
            pos = nxt
        if pos < n:
            self._hold(data[pos:])

    def flush(self, *, dispatch_unterminated: bool = False) -> list[SSEEvent]:
        """End of stream. Returns the pending event only when asked to (see class docstring)."""
        events: list[SSEEvent] = []
        if self._pieces:
            # The last line, which lacks its end.
            pending = _joined(self._pieces)
            self._pieces = []
            self._held = 0
            self._line(pending, events)
        self._skipping = False
        if dispatch_unterminated:
            self._dispatch(events)
        self._reset_event()
        self._pending_cr = False
        return events

    @property
    def held(self) -> int:
        """Bytes of an unfinished line held (at most ``max_line``)."""
        return self._held

    @property
    def has_pending(self) -> bool:
        """True when bytes or fields of an unfinished event are held."""
        return bool(self._pieces) or self._has_data or self._event is not None

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
