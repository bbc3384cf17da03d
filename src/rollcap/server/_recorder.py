"""The per-call recorder: a small state machine that turns one exchange into one raw record.

Pure: it is handed bytes and clock readings and never reads a clock, a socket or a file itself,
so every ending can be tested with plain values. Contract: every call that is started ends in
exactly one record, whatever happens (normal end, upstream failure, client gone, exception).

The record also says how the answer came about (its execution fields): whether the server
sent the request upstream (``upstream_attempted``), whose answer the client got
(``response_source``: ``upstream``, also when the server translated it, or ``local``, an
answer of the server's own), the upstream's HTTP status (``upstream_status_code``) and, for
a local answer, why (``local_response_reason``, a ``LocalReason``). The server tells the
recorder as it goes: ``upstream_attempt``, ``upstream_status``, ``answered_locally``.

What a call costs while it runs is bounded by ``max_response_bytes``: a stream is reassembled
as its chunks pass, and its raw text is kept once, as bytes, up to the bound; past it the raw
text stops growing, and so does the reassembled response once it passes the bound too (the
terminal event still counts, so the call's outcome stays right). A non-streamed body is kept
for the record up to the bound. The record then says what it lacks with a
``GAP_CAPTURE_OVER_LIMIT`` gap. The client always gets every byte: this is only what is kept.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from rollcap._json import encode_in_slices, text_in_slices, text_slices
from rollcap.dialects import (
    StreamOutcome,
    StreamReassembler,
    context_length_exceeded,
    get_dialect,
)
from rollcap.records import (
    CAPTURE_MAX_RESPONSE_BYTES,
    GAP_CAPTURE_OVER_LIMIT,
    ErrorCategory,
    Gap,
    error_category,
    model_ref,
    record_json,
)
from rollcap.sse import SSEDecoder, is_event_stream

__all__ = ["CallFailure", "CallRecorder", "Clock", "LocalReason"]


class CallFailure(enum.Enum):
    """Why a call ended without a complete upstream answer, as the server saw it."""

    CONNECTION = "connection"  # upstream unreachable or the connection broke before a status
    TIMEOUT = "timeout"  # upstream too slow
    CANCELLED = "cancelled"  # the client went away mid-call
    EXCEPTION = "exception"  # a bug or unexpected error inside the server


class LocalReason(enum.StrEnum):
    """Why the server answered a call itself (``local_response_reason``)."""

    INVALID_REQUEST = "invalid_request"  # refused before anything went upstream
    UPSTREAM_UNREACHABLE = "upstream_unreachable"  # no connection, or it broke before a status
    UPSTREAM_TIMEOUT = "upstream_timeout"  # upstream too slow
    UPSTREAM_ANSWER_INVALID = "upstream_answer_invalid"  # an answer the server could not use
    TOKEN_CAPTURE_FAILED = "token_capture_failed"  # RL staging failed the call closed
    SERVER_ERROR = "server_error"  # a bug or unexpected error inside the server
    STATE_ONLY = "state_only"  # a WebSocket turn with generate: false: state kept, no answer


# The server's own answer to a failure noted before the response started.
_FAILURE_REASONS = {
    CallFailure.CONNECTION: LocalReason.UPSTREAM_UNREACHABLE,
    CallFailure.TIMEOUT: LocalReason.UPSTREAM_TIMEOUT,
    CallFailure.EXCEPTION: LocalReason.SERVER_ERROR,
}

_UPSTREAM_FAILURES = {
    ErrorCategory.CONNECTION: CallFailure.CONNECTION,
    ErrorCategory.TIMEOUT: CallFailure.TIMEOUT,
}


@dataclass(frozen=True, slots=True)
class Clock:
    """One reading of both clocks: wall time for timestamps, monotonic time for latencies."""

    wall: float
    mono: float


def _object_or_none(raw: bytes | bytearray) -> dict[str, Any] | None:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _object_fragment(raw: bytes | bytearray, value: dict[str, Any]) -> orjson.Fragment:
    """``value``, parsed from ``raw``, as a record's JSON: a body with no line break in it is
    already the one line a record needs, and goes in as it came, without encoding it again."""
    if b"\n" not in raw and b"\r" not in raw:
        return orjson.Fragment(bytes(raw))
    return encode_in_slices(value)


def _json_object(raw: bytes | bytearray) -> tuple[dict[str, Any] | None, str | None]:
    """``(object, None)`` for a JSON object body, else ``(None, text)`` so nothing is lost."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, raw.decode("utf-8", errors="replace")
    if isinstance(value, dict):
        return value, None
    return None, raw.decode("utf-8", errors="replace")


class CallRecorder:
    """Feed the exchange as it happens; ``finish`` ends it; ``record()`` (or, for a big record
    built off the event loop, ``record_in_slices()``) gives its one record."""

    __slots__ = (
        "_attempted",
        "_body_bytes",
        "_client_events",
        "_context_exceeded",
        "_decoder",
        "_dialect",
        "_end",
        "_failure",
        "_finished",
        "_first_byte",
        "_gaps",
        "_limit",
        "_local_reason",
        "_parts",
        "_raw",
        "_raw_cut",
        "_reassembled_upto",
        "_reassembler",
        "_request_body",
        "_server_name",
        "_session_id",
        "_start",
        "_streaming",
        "_synthetic",
        "_terminal_seen",
        "_transport",
        "_upstream_status",
        "model_call_id",
        "status_code",
    )

    def __init__(
        self,
        *,
        model_call_id: str,
        dialect: str,
        server_name: str,
        start: Clock,
        client_session_id: str | None = None,
        max_response_bytes: int = CAPTURE_MAX_RESPONSE_BYTES,
        transport: str | None = None,
    ) -> None:
        self.model_call_id = model_call_id
        self._transport = transport
        # A WebSocket turn's other client events, as sent (``client_event``).
        self._client_events: list[dict[str, Any]] = []
        self._dialect = get_dialect(dialect)
        self._server_name = server_name
        self._start = start
        self._session_id = client_session_id
        self._limit = max_response_bytes
        self._request_body: bytes | bytearray | None = None  # None: no body was taken
        self.status_code: int | None = None
        self._streaming = False
        self._first_byte: float | None = None
        self._body_bytes = 0  # every body byte that came, kept or not
        self._raw = bytearray()  # a stream's bytes, up to the limit
        self._raw_cut = False
        self._parts: list[bytes] = []  # a non-streamed body's chunks, as the client gets them
        self._failure: CallFailure | None = None
        self._synthetic = False
        # A line of the stream longer than the limit is let go rather than held.
        self._decoder = SSEDecoder(max_line=max_response_bytes)
        self._reassembler: StreamReassembler | None = None
        self._reassembled_upto: int | None = None  # stream bytes reassembled, once it stopped
        self._terminal_seen = False
        self._end: Clock | None = None
        self._finished = False
        self._gaps: list[Gap] = []
        self._attempted = False
        self._upstream_status: int | None = None
        self._local_reason: LocalReason | None = None
        self._context_exceeded = False

    def request(self, body: bytes | bytearray) -> None:
        """The request body, as the server holds it (kept by reference, never copied)."""
        self._request_body = body

    def upstream_attempt(self) -> None:
        """The request is on its way upstream (whether or not it arrives)."""
        self._attempted = True

    def upstream_status(self, status: int) -> None:
        """Upstream answered with ``status`` (its headers came); the first one is kept."""
        self._attempted = True
        if self._upstream_status is None:
            self._upstream_status = status

    def answered_locally(self, reason: LocalReason) -> None:
        """The server answers this call itself, for ``reason``; the first reason is kept."""
        if self._local_reason is None and not self._finished:
            self._local_reason = reason

    def context_exceeded(self) -> None:
        """Upstream said the prompt does not fit the model's context, in an answer the server
        reshaped before the client got it (a translated error keeps no code to read it from)."""
        self._context_exceeded = True

    def fail(self, failure: CallFailure) -> None:
        """Note why the call could not complete; the first reason given is kept.

        A failure noted before the response starts means the response the client then gets is
        the server's own error answer, not the upstream's: it is not recorded as upstream data.
        """
        if self._failure is None and not self._finished:
            self._failure = failure

    def upstream_failed(self, category: ErrorCategory) -> None:
        """Upstream was unreachable (``CONNECTION``) or too slow (``TIMEOUT``): as ``fail``."""
        failure = _UPSTREAM_FAILURES.get(category)
        if failure is not None:
            self.fail(failure)

    def client_event(self, event: dict[str, Any]) -> None:
        """A client event other than the turn's own ``response.create``, sent on its WebSocket
        while the turn ran (``response.steer``, ...): kept with the turn, as sent."""
        self._client_events.append(event)

    def gap(self, code: str, detail: str | None = None) -> None:
        """Say what the record lacks or why the call failed, beyond the error category."""
        self._gaps.append(Gap(code, detail))

    def response_start(self, status: int, headers: Mapping[str, str]) -> None:
        """The answer starts: its status, and its headers by lower-case name (only
        ``content-type`` is read)."""
        if self._failure is not None:
            self._synthetic = True
            return
        self.status_code = status
        self._streaming = is_event_stream(headers.get("content-type"))
        if self._streaming:
            self._reassembler = self._dialect.new_reassembler()

    @property
    def streaming(self) -> bool:
        return self._streaming

    def first_byte(self, mono: float) -> None:
        """The first body byte arrived from upstream (the time to first token)."""
        if self._first_byte is None:
            self._first_byte = mono

    def upstream_bytes(self, mono: float, size: int) -> None:
        """Bytes of the answer arrived (``Observer``): the first of them is the TTFT."""
        self.first_byte(mono)

    @property
    def kept_bytes(self) -> int:
        """About how many bytes the call's record is built from: the request, the raw response,
        the reassembled one and a line still held (what building the record costs grows with
        it)."""
        reassembled = 0 if self._reassembler is None else self._reassembler.size
        reassembled += self._decoder.held
        kept = len(self._raw) if self._streaming else min(self._body_bytes, self._limit)
        request = 0 if self._request_body is None else len(self._request_body)
        return request + kept + reassembled

    def body(self, chunk: bytes) -> bool:
        """Take a body chunk; true when it completes the stream's terminal event.

        The server holds such a chunk back until the record is durable, so a client that saw
        the end of a stream can rely on its record being on disk. A stream's events are
        reassembled here, as they come, so what the call holds is its answer, not its events.
        """
        if not chunk or self._synthetic:
            return False
        size = len(chunk)
        self._body_bytes += size
        reassembler = self._reassembler
        if reassembler is None:  # not streamed: the chunks are the client's, held anyway
            if self._body_bytes <= self._limit:
                self._parts.append(chunk)
            elif self._parts:
                self._parts = []
            return False
        if not self._raw_cut:
            raw = self._raw
            room = self._limit - len(raw)
            if size <= room:
                raw += chunk
            else:
                raw += chunk[:room]
                self._raw_cut = True
        events = self._decoder.feed(chunk)
        if not events:
            return False
        # Every event is reassembled (and the first terminal one noted) while the answer is
        # under the bound; past it, only the terminal event still counts. Every captured
        # stream goes through here on the event loop, event by event: keep it cheap.
        terminal = False
        if self._reassembled_upto is None:
            feed = reassembler.feed
            if self._terminal_seen:
                for event in events:
                    feed(event)
            else:
                is_terminal = self._dialect.is_terminal_event
                for event in events:
                    if not terminal and is_terminal(event):
                        terminal = self._terminal_seen = True
                    feed(event)
            if reassembler.size > self._limit:
                self._reassembled_upto = self._body_bytes
        elif not self._terminal_seen:
            is_terminal = self._dialect.is_terminal_event
            for event in events:
                if is_terminal(event):
                    terminal = self._terminal_seen = True
                    reassembler.feed(event)  # the outcome rests on it
                    break
        return terminal

    @property
    def finished(self) -> bool:
        return self._finished

    def finish(self, end: Clock, failure: CallFailure | None = None) -> None:
        """The call is over: nothing more is taken. Called once; a second call is a bug."""
        if self._finished:
            raise RuntimeError(f"model call {self.model_call_id} already recorded")
        self._finished = True
        self._end = end
        if failure is not None and self._failure is None:
            self._failure = failure

    def _flush(self) -> None:
        """Feed what the decoder still holds: a capture keeps what arrived, an event cut off
        by the end included. Part of building the record (it may be a long line's worth of
        work), so it runs wherever the record is built; once."""
        if self._reassembler is None:
            return
        for event in self._decoder.flush(dispatch_unterminated=True):
            if self._reassembled_upto is None or (
                not self._terminal_seen and self._dialect.is_terminal_event(event)
            ):
                self._reassembler.feed(event)

    def record(self) -> dict[str, Any]:
        """Build the finished call's record (the answer is parsed or its reassembly finished),
        as its JSON object (``rollcap.records.record_json``: what ``RawRecord.to_json`` gives):
        built once, and encoded once, by the store that writes it.

        Its cost grows with ``kept_bytes``: the middleware builds small records here, on the
        event loop, and big ones with ``record_in_slices`` in a thread.
        """
        request, request_raw = (
            (None, None) if self._request_body is None else _json_object(self._request_body)
        )
        response: dict[str, Any] | None = None
        response_raw: str | None = None
        if self._streaming:
            response_raw = self._raw.decode("utf-8", errors="replace")
        else:
            response, response_raw = self._answer()
        return self._build(request, request_raw, response, response_raw)

    def record_in_slices(self) -> dict[str, Any]:
        """The finished call's record as its JSON object, for a record too big to build on the
        event loop: its long texts and objects are ``orjson.Fragment``s encoded a slice at a
        time (``rollcap._json``), so the thread building it lets others run between slices.

        It hands the raw response over: the recorder holds it no more (a second build lacks it).
        """
        fragments: dict[str, orjson.Fragment] = {}
        body = self._request_body
        if body is not None:
            request = _object_or_none(body)
            if request is not None:
                fragments["request"] = _object_fragment(body, request)
            else:
                fragments["request_raw"] = text_in_slices(body)
        response: dict[str, Any] | None = None
        if self._streaming:
            # Handed over, so that it is let go as soon as its text is encoded.
            stream, self._raw = self._raw, bytearray()
            pieces = list(text_slices(stream))
            del stream
            fragments["response_raw"] = orjson.Fragment(b"".join(pieces))
            del pieces
        elif self._body_bytes or self.status_code is not None:
            answer = b"".join(self._parts)
            if self._body_bytes <= self._limit:
                response = _object_or_none(answer)
                if response is not None:
                    fragments["response"] = _object_fragment(answer, response)
                else:
                    fragments["response_raw"] = text_in_slices(answer)
        # The record's own fields, with placeholders where a fragment goes, so that each key
        # keeps its place; then the fragments go in.
        out = self._build(
            None,
            "" if "request_raw" in fragments else None,
            response,
            "" if "response_raw" in fragments else None,
        )
        self.release()  # the reassembler's pieces: the response holds them joined now
        rebuilt, out["response"] = out["response"], None
        if self._streaming and rebuilt is not None:
            fragments["response"] = encode_in_slices(rebuilt)
        del rebuilt
        out.update(fragments)
        return out

    def release(self) -> None:
        """Let go of what the call kept (its raw response, its reassembly), once its record
        is built: a call can outlive its record's building by the time it takes to write it."""
        self._raw, self._parts, self._reassembler = bytearray(), [], None

    def _answer(self) -> tuple[dict[str, Any] | None, str | None]:
        """A non-streamed answer's object, or its text when it is not one; nothing when there
        was no answer, or when it was too big to keep."""
        if not (self._body_bytes or self.status_code is not None):
            return None, None
        if self._body_bytes > self._limit:
            return None, None
        return _json_object(b"".join(self._parts))

    def _build(
        self,
        request: dict[str, Any] | None,
        request_raw: str | None,
        response: dict[str, Any] | None,
        response_raw: str | None,
    ) -> dict[str, Any]:
        if self._end is None:
            raise RuntimeError(f"model call {self.model_call_id} is not finished")
        self._flush()
        end = self._end
        failure = self._failure
        flags: dict[str, bool] = {}
        gaps = list(self._gaps)
        if self._reassembler is not None:
            result = self._reassembler.finish()
            response = result.response
            flags["stream_error"] = result.outcome is StreamOutcome.ERROR
            flags["incomplete"] = result.outcome is StreamOutcome.INCOMPLETE
            # A stream the client abandoned was not truncated by upstream.
            flags["truncated"] = result.truncated and failure in (None, CallFailure.EXCEPTION)
            gaps += self._stream_gaps()
        elif self._body_bytes or self.status_code is not None:
            over = self._body_bytes > self._limit
            ok = self.status_code is not None and 200 <= self.status_code < 300
            flags["parse_failed"] = (
                ok and response is None and failure is None and bool(self._body_bytes) and not over
            )
            if response is not None and self._dialect.name == "responses":
                flags["incomplete"] = response.get("status") == "incomplete"
            if over:
                gaps.append(
                    Gap(
                        GAP_CAPTURE_OVER_LIMIT,
                        f"response: a body of {self._body_bytes} bytes, over "
                        f"capture_max_response_bytes={self._limit}, was not kept",
                    )
                )
        status = self.status_code
        if failure is CallFailure.EXCEPTION and status is None:
            status = 500  # what the client is answered
        reason = self._local_reason
        if reason is None and failure is not None and (self._synthetic or self.status_code is None):
            # The client's answer, if any, is the server's own (a failure answer, or a 500).
            reason = _FAILURE_REASONS.get(failure)
        source = "local" if reason is not None else None
        if source is None and self._upstream_status is not None:
            source = "upstream"
        exceeded = self._context_exceeded or (
            source == "upstream" and context_length_exceeded(status, response)
        )
        category = error_category(
            status,
            context_length_exceeded=exceeded,
            cancelled=failure is CallFailure.CANCELLED,
            connection_failed=failure is CallFailure.CONNECTION,
            timed_out=failure is CallFailure.TIMEOUT,
            **flags,
        )
        ttft = None if self._first_byte is None else (self._first_byte - self._start.mono) * 1000
        return record_json(
            model_call_id=self.model_call_id,
            dialect=self._dialect.name,
            model_ref=model_ref(self._server_name),
            started_at=self._start.wall,
            completed_at=end.wall,
            latency_ms=(end.mono - self._start.mono) * 1000,
            latency_ttft_ms=ttft,
            status_code=status,
            error_category=category,
            request=request,
            response=response,
            request_raw=request_raw,
            response_raw=response_raw,
            client_session_id=self._session_id,
            gaps=[gap.to_dict() for gap in gaps] or None,
            upstream_attempted=self._attempted,
            response_source=source,
            upstream_status_code=self._upstream_status,
            local_response_reason=None if reason is None else reason.value,
            transport=self._transport,
            client_events=list(self._client_events) or None,
        )

    def _stream_gaps(self) -> list[Gap]:
        gaps: list[Gap] = []
        if self._raw_cut:
            gaps.append(
                Gap(
                    GAP_CAPTURE_OVER_LIMIT,
                    f"response_raw: the first {self._limit} of {self._body_bytes} bytes "
                    f"(capture_max_response_bytes)",
                )
            )
        if self._reassembled_upto is not None or self._decoder.dropped_lines:
            upto = self._body_bytes if self._reassembled_upto is None else self._reassembled_upto
            dropped = self._decoder.dropped_lines
            gaps.append(
                Gap(
                    GAP_CAPTURE_OVER_LIMIT,
                    f"response: reassembled from the stream's first {upto} bytes, and its "
                    f"terminal event, of {self._body_bytes} (capture_max_response_bytes="
                    f"{self._limit})"
                    + (f"; {dropped} lines longer than that were dropped" if dropped else ""),
                )
            )
        return gaps
