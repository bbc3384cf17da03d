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
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from rollcap.dialects import StreamOutcome, context_length_exceeded, get_dialect
from rollcap.records import ErrorCategory, Gap, RawRecord, error_category, model_ref
from rollcap.sse import SSEDecoder, SSEEvent, is_event_stream

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


def _json_object(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """``(object, None)`` for a JSON object body, else ``(None, text)`` so nothing is lost."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, raw.decode("utf-8", errors="replace")
    if isinstance(value, dict):
        return value, None
    return None, raw.decode("utf-8", errors="replace")


class CallRecorder:
    """Feed the exchange as it happens; ``finish`` gives the record, once."""

    __slots__ = (
        "_attempted",
        "_body",
        "_context_exceeded",
        "_decoder",
        "_dialect",
        "_end",
        "_events",
        "_failure",
        "_finished",
        "_first_byte",
        "_gaps",
        "_local_reason",
        "_request_body",
        "_server_name",
        "_session_id",
        "_start",
        "_streaming",
        "_synthetic",
        "_terminal_seen",
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
    ) -> None:
        self.model_call_id = model_call_id
        self._dialect = get_dialect(dialect)
        self._server_name = server_name
        self._start = start
        self._session_id = client_session_id
        self._request_body = b""
        self.status_code: int | None = None
        self._streaming = False
        self._first_byte: float | None = None
        self._body: list[bytes] = []
        self._failure: CallFailure | None = None
        self._synthetic = False
        self._decoder = SSEDecoder()
        self._events: list[SSEEvent] = []
        self._terminal_seen = False
        self._end: Clock | None = None
        self._finished = False
        self._gaps: list[Gap] = []
        self._attempted = False
        self._upstream_status: int | None = None
        self._local_reason: LocalReason | None = None
        self._context_exceeded = False

    def request(self, body: bytes) -> None:
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

    def gap(self, code: str, detail: str | None = None) -> None:
        """Say what the record lacks or why the call failed, beyond the error category."""
        self._gaps.append(Gap(code, detail))

    def response_start(self, status: int, headers: Mapping[str, str]) -> None:
        if self._failure is not None:
            self._synthetic = True
            return
        self.status_code = status
        self._streaming = is_event_stream(headers.get("content-type"))

    @property
    def streaming(self) -> bool:
        return self._streaming

    def first_byte(self, mono: float) -> None:
        """The first body byte arrived from upstream (the time to first token)."""
        if self._first_byte is None:
            self._first_byte = mono

    def body(self, chunk: bytes) -> bool:
        """Take a body chunk; true when it completes the stream's terminal event.

        The server holds such a chunk back until the record is durable, so a client that saw
        the end of a stream can rely on its record being on disk.
        """
        if not chunk or self._synthetic:
            return False
        self._body.append(chunk)
        if not self._streaming:
            return False
        # Only the cheap part happens here, per chunk: cutting events and spotting the terminal
        # one. Parsing them into the answer waits for ``record``, once, when the call is over.
        events = self._decoder.feed(chunk)
        self._events += events
        if self._terminal_seen:
            return False
        is_terminal = self._dialect.is_terminal_event
        for event in events:
            if is_terminal(event):
                self._terminal_seen = True
                return True
        return False

    @property
    def finished(self) -> bool:
        return self._finished

    def finish(self, end: Clock, failure: CallFailure | None = None) -> None:
        """The call is over: nothing more is taken. Called once; a second call is a bug."""
        if self._finished:
            raise RuntimeError(f"model call {self.model_call_id} already recorded")
        self._finished = True
        self._end = end
        if self._streaming:
            # A capture keeps what arrived, an event cut off by the end included.
            self._events += self._decoder.flush(dispatch_unterminated=True)
        if failure is not None and self._failure is None:
            self._failure = failure

    def record(self) -> RawRecord:
        """Build the finished call's record: the costly part (reassembly, parsing), done once.

        The middleware builds it on the event loop, right before handing it to the writer.
        """
        if self._end is None:
            raise RuntimeError(f"model call {self.model_call_id} is not finished")
        end = self._end
        failure = self._failure
        request, request_raw = _json_object(self._request_body)
        raw_body = b"".join(self._body)
        response: dict[str, Any] | None = None
        response_raw: str | None = None
        flags: dict[str, bool] = {}
        if self._streaming:
            reassembler = self._dialect.new_reassembler()
            for event in self._events:
                reassembler.feed(event)
            result = reassembler.finish()
            response = result.response
            response_raw = raw_body.decode("utf-8", errors="replace")
            flags["stream_error"] = result.outcome is StreamOutcome.ERROR
            flags["incomplete"] = result.outcome is StreamOutcome.INCOMPLETE
            # A stream the client abandoned was not truncated by upstream.
            flags["truncated"] = result.truncated and failure in (None, CallFailure.EXCEPTION)
        elif raw_body or self.status_code is not None:
            response, response_raw = _json_object(raw_body)
            ok = self.status_code is not None and 200 <= self.status_code < 300
            flags["parse_failed"] = ok and response is None and failure is None and bool(raw_body)
            if response is not None and self._dialect.name == "responses":
                flags["incomplete"] = response.get("status") == "incomplete"
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
        return RawRecord(
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
            gaps=[gap.to_dict() for gap in self._gaps] or None,
            upstream_attempted=self._attempted,
            response_source=source,
            upstream_status_code=self._upstream_status,
            local_response_reason=None if reason is None else reason.value,
        )
