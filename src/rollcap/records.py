"""The raw capture record, the normalized ``ModelCallRecord``, and error categories (pure).

A raw record is one line of ``<rollout_id>.capture.jsonl``: exactly the contract's keys, so other
implementations of the format can read our files and we can read theirs. A ``ModelCallRecord`` is
derived from a raw record by the dialect's ``normalize``; it is never stored, always recomputed, so
a fix to normalization applies to files already written.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from rollcap._json import as_count, as_str
from rollcap.dialects import DIALECT_NAMES, Normalized, get_dialect

__all__ = [
    "CAPTURE_GAP_CODES",
    "CAPTURE_MAX_RESPONSE_BYTES",
    "GAP_CAPTURE_OVER_LIMIT",
    "GAP_INCOMPLETE",
    "GAP_NO_RECORDS",
    "GAP_RECORDS_UNREADABLE",
    "GAP_TOKEN_CAPTURE_FAILED",
    "GAP_TRAJECTORY_PROJECTION_FAILED",
    "GAP_UNREADABLE",
    "MODEL_REF_TYPE",
    "TRANSPORT_WEBSOCKET",
    "ErrorCategory",
    "Gap",
    "ModelCallRecord",
    "RawRecord",
    "error_category",
    "infer_dialect",
    "is_streamed",
    "model_ref",
    "record_json",
]

MODEL_REF_TYPE = "responses_api_models"

# Gap codes rollcap itself emits about capture. Producers' and the evidence pipeline's own codes
# are free-form strings carried by the same ``Gap``.
GAP_NO_RECORDS = "model_call_capture_no_records"
GAP_RECORDS_UNREADABLE = "model_call_capture_records_unreadable"
GAP_INCOMPLETE = "model_call_capture_incomplete"
GAP_UNREADABLE = "model_call_capture_unreadable"
GAP_TRAJECTORY_PROJECTION_FAILED = "trajectory_projection_failed"
GAP_TOKEN_CAPTURE_FAILED = "token_capture_failed"
# A record that keeps less than the call exchanged because it passed a configured bound
# (``capture_max_response_bytes``, ``max_request_bytes``); the detail says what was left out.
GAP_CAPTURE_OVER_LIMIT = "model_call_capture_over_limit"
# The default of ``capture_max_response_bytes``: the most of one response a record keeps.
CAPTURE_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
CAPTURE_GAP_CODES = (GAP_NO_RECORDS, GAP_RECORDS_UNREADABLE, GAP_INCOMPLETE, GAP_UNREADABLE)


@dataclass(frozen=True, slots=True)
class Gap:
    """Something a record, an attachment or a trajectory lacks, and why.

    Two dumps, as the formats want them: ``to_dict`` omits the null keys (a capture record's and
    ``ng_model_call_capture``'s gaps), ``dump`` always has ``code``, ``invocation_id`` and
    ``detail`` in that order (agent observations' and ``ng_trajectory``'s gaps).
    """

    code: str
    detail: str | None = None
    invocation_id: str | None = None

    def to_dict(self) -> dict[str, str]:
        out = {"code": self.code}
        if self.invocation_id is not None:
            out["invocation_id"] = self.invocation_id
        if self.detail is not None:
            out["detail"] = self.detail
        return out

    def dump(self) -> dict[str, str | None]:
        return {"code": self.code, "invocation_id": self.invocation_id, "detail": self.detail}


class ErrorCategory(enum.StrEnum):
    TIMEOUT = "timeout"
    RATE_LIMIT = "rate_limit"
    AUTH = "auth"
    NOT_FOUND = "not_found"
    CLIENT_ERROR = "client_error"
    UPSTREAM_ERROR = "upstream_error"
    INCOMPLETE = "incomplete"
    STREAM_TRUNCATED = "stream_truncated"
    CANCELLED = "cancelled"
    CONNECTION = "connection"
    CAPTURE_PARSE_ERROR = "capture_parse_error"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


def error_category(
    status_code: int | None,
    *,
    context_length_exceeded: bool = False,
    stream_error: bool = False,
    incomplete: bool = False,
    truncated: bool = False,
    cancelled: bool = False,
    connection_failed: bool = False,
    timed_out: bool = False,
    parse_failed: bool = False,
) -> ErrorCategory | None:
    """The contract's error category of one call: the first rule that applies, else ``None``.

    A prompt longer than the model's context comes first: an OpenAI-compatible server refuses
    it with a plain 400, which the status alone would call ``client_error``, and a model server
    that answers it locally sends no upstream status at all. Then the HTTP status decides, so a
    429 whose body also failed to parse is ``rate_limit``.
    """
    if context_length_exceeded:
        return ErrorCategory.CONTEXT_LENGTH_EXCEEDED
    if status_code is not None:
        if status_code in (408, 504):
            return ErrorCategory.TIMEOUT
        if status_code == 429:
            return ErrorCategory.RATE_LIMIT
        if status_code in (401, 403):
            return ErrorCategory.AUTH
        if status_code == 404:
            return ErrorCategory.NOT_FOUND
        if 400 <= status_code < 500:
            return ErrorCategory.CLIENT_ERROR
        if 500 <= status_code < 600:
            return ErrorCategory.UPSTREAM_ERROR
    for applies, category in (
        (stream_error, ErrorCategory.UPSTREAM_ERROR),
        (incomplete, ErrorCategory.INCOMPLETE),
        (truncated, ErrorCategory.STREAM_TRUNCATED),
        (cancelled, ErrorCategory.CANCELLED),
        (connection_failed, ErrorCategory.CONNECTION),
        (timed_out, ErrorCategory.TIMEOUT),
        (parse_failed, ErrorCategory.CAPTURE_PARSE_ERROR),
    ):
        if applies:
            return category
    return None


def infer_dialect(response: object) -> str | None:
    """The dialect a response object's shape says it is, for a record that names none we know.

    By the list each dialect keeps its answer in, in the order NeMo Gym's reader tries them
    (``output``: responses, ``choices``: chat, ``content``: messages), so a record without a
    ``dialect`` (another implementation's, an older one's) reads as it reads there; failing
    those, by the object's own type (``object`` ``response`` or ``chat.completion``, ``type``
    ``message``). ``None`` when neither tells.
    """
    if not isinstance(response, Mapping):
        return None
    for key, dialect in (("output", "responses"), ("choices", "chat"), ("content", "messages")):
        if isinstance(response.get(key), list):
            return dialect
    kind = response.get("object")
    if kind == "response":
        return "responses"
    if isinstance(kind, str) and kind.startswith("chat.completion"):
        return "chat"
    if response.get("type") == "message":
        return "messages"
    return None


def model_ref(server_name: str) -> dict[str, str]:
    return {"type": MODEL_REF_TYPE, "name": server_name}


def round_ms(value: float | None) -> float | None:
    """Latencies are kept in milliseconds at 2 decimals, as the format says."""
    return None if value is None else round(float(value), 2)


# How the model server produced a call's answer: whether it tried the upstream, whether the
# answer is the upstream's or its own, the upstream's HTTP status, and why it answered itself.
EXECUTION_KEYS = (
    "upstream_attempted",
    "response_source",
    "upstream_status_code",
    "local_response_reason",
)
RESPONSE_SOURCES = frozenset(("upstream", "local"))
# A call that came over a Responses WebSocket (one turn of it) says so: ``transport`` is
# ``"websocket"`` (absent: an HTTP call), and ``client_events`` holds the other client events
# the socket sent during the turn (``response.steer``, ...), as sent.
TRANSPORT_KEYS = ("transport", "client_events")
TRANSPORT_WEBSOCKET = "websocket"

_OPTIONAL_KEYS = (
    "request_raw",
    "response_raw",
    "client_session_id",
    *EXECUTION_KEYS,
    "gaps",
    *TRANSPORT_KEYS,
)


_OPTIONAL = frozenset(_OPTIONAL_KEYS)


def record_json(
    *,
    model_call_id: str,
    dialect: str,
    model_ref: dict[str, Any],
    started_at: float,
    completed_at: float,
    latency_ms: float | None,
    latency_ttft_ms: float | None,
    status_code: int | None,
    error_category: str | None,
    request: dict[str, Any] | None,
    response: dict[str, Any] | None,
    **optional: Any,
) -> dict[str, Any]:
    """A raw record's JSON object, the contract's keys in their order: the one home of the
    line's shape, ``RawRecord.to_json`` included. Latencies are rounded as ``RawRecord``
    rounds them; an optional key (``request_raw``, ..., ``client_events``) is written only when
    it is not None, and one the contract does not name raises ``TypeError``. For a producer
    that writes a record without reading it back (the model server), no ``RawRecord`` is made.
    """
    unknown = optional.keys() - _OPTIONAL
    if unknown:
        raise TypeError(f"a raw record has no {', '.join(sorted(unknown))}")
    out: dict[str, Any] = {
        "model_call_id": model_call_id,
        "dialect": dialect,
        "model_ref": model_ref,
        "started_at": started_at,
        "completed_at": completed_at,
        "latency_ms": round_ms(latency_ms),
        "latency_ttft_ms": round_ms(latency_ttft_ms),
        "status_code": status_code,
        "error_category": (
            error_category.value if isinstance(error_category, ErrorCategory) else error_category
        ),
        "request": request,
        "response": response,
    }
    for key in _OPTIONAL_KEYS:
        value = optional.get(key)
        if value is not None:
            out[key] = value
    return out


def is_streamed(request: object, transport: object) -> bool:
    """Whether a call's answer came as a stream: its request asked for one, or it was a turn of
    a Responses WebSocket, where every answer is one (its request has no ``stream``)."""
    if transport == TRANSPORT_WEBSOCKET:
        return True
    return isinstance(request, Mapping) and request.get("stream") is True


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One captured exchange, as persisted. ``to_json`` gives exactly the contract's keys."""

    model_call_id: str
    dialect: str
    model_ref: dict[str, Any]
    started_at: float
    completed_at: float
    latency_ms: float | None
    latency_ttft_ms: float | None
    status_code: int | None
    error_category: str | None
    request: dict[str, Any] | None
    response: dict[str, Any] | None
    request_raw: str | None = None
    response_raw: str | None = None
    client_session_id: str | None = None
    gaps: list[dict[str, Any]] | None = None
    upstream_attempted: bool | None = None
    response_source: str | None = None
    upstream_status_code: int | None = None
    local_response_reason: str | None = None
    transport: str | None = None
    client_events: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        # Latencies are kept at 2 decimals, as the format says; rounding here means every
        # producer of a record agrees without having to remember.
        object.__setattr__(self, "latency_ms", round_ms(self.latency_ms))
        object.__setattr__(self, "latency_ttft_ms", round_ms(self.latency_ttft_ms))

    def to_json(self) -> dict[str, Any]:
        return record_json(**{f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> RawRecord:
        """Read a persisted line leniently: unknown keys are ignored, mistyped ones become null.

        Files written by other implementations (or later versions) must still read.
        """

        def _num(key: str) -> float | None:
            value = obj.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                return None
            return float(value)

        def _obj(key: str) -> dict[str, Any] | None:
            value = obj.get(key)
            return value if isinstance(value, dict) else None

        def _int(key: str) -> int | None:
            value = obj.get(key)
            return None if isinstance(value, bool) or not isinstance(value, int) else value

        attempted = obj.get("upstream_attempted")
        source = obj.get("response_source")
        gaps = obj.get("gaps")
        events = obj.get("client_events")
        return cls(
            model_call_id=as_str(obj.get("model_call_id")) or "",
            dialect=as_str(obj.get("dialect")) or "",
            model_ref=_obj("model_ref") or {},
            started_at=_num("started_at") or 0.0,
            completed_at=_num("completed_at") or 0.0,
            latency_ms=_num("latency_ms"),
            latency_ttft_ms=_num("latency_ttft_ms"),
            status_code=_int("status_code"),
            error_category=as_str(obj.get("error_category")),
            request=_obj("request"),
            response=_obj("response"),
            request_raw=as_str(obj.get("request_raw")),
            response_raw=as_str(obj.get("response_raw")),
            client_session_id=as_str(obj.get("client_session_id")),
            gaps=[g for g in gaps if isinstance(g, dict)] if isinstance(gaps, list) else None,
            upstream_attempted=attempted if isinstance(attempted, bool) else None,
            response_source=source if source in RESPONSE_SOURCES else None,
            upstream_status_code=_int("upstream_status_code"),
            local_response_reason=as_str(obj.get("local_response_reason")),
            transport=as_str(obj.get("transport")),
            client_events=[e for e in events if isinstance(e, dict)]
            if isinstance(events, list)
            else None,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCallRecord:
    """One model call, normalized. Field order is the dump's (EVIDENCE.md section 3.3).

    Every field is present in a dump, null when unknown: ``model_ref`` is null unless the raw
    record names a model server, and ``client_session_id`` unless the raw record's is a string.
    The four execution fields are copied from the raw record when it has them.
    """

    model_call_id: str
    response_id: str | None = None
    client_session_id: str | None = None
    call_index: int
    model_ref: dict[str, str] | None = None
    model: str | None = None
    dialect: str
    status_code: int | None = None
    response_status: str | None = None
    finish_reason: str | None = None
    upstream_attempted: bool | None = None
    response_source: str | None = None
    upstream_status_code: int | None = None
    local_response_reason: str | None = None
    started_at: float
    completed_at: float
    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_reasoning: int | None = None
    tokens_total: int | None = None
    request: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    request_raw: str | None = None
    response_raw: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    reasoning_content: str | None = None
    cache_hit: bool | None = None
    cached_tokens: int | None = None
    cache_creation_tokens: int | None = None
    error_category: str | None = None
    latency_total_ms: float | None = None
    latency_ttft_ms: float | None = None

    @classmethod
    def from_raw(cls, raw: RawRecord | Mapping[str, Any], call_index: int) -> ModelCallRecord:
        if not isinstance(raw, RawRecord):
            raw = RawRecord.from_json(raw)
        normalized = Normalized()
        # A record whose dialect we do not know is read by its response's shape (as NeMo Gym
        # reads every record), so it still gets its usage, finish reason and status.
        dialect = raw.dialect if raw.dialect in DIALECT_NAMES else infer_dialect(raw.response)
        if raw.response is not None and dialect is not None:
            normalized = get_dialect(dialect).normalize(raw.response)
        usage = normalized.usage
        request_model = as_str((raw.request or {}).get("model"))
        cached = as_count(usage.cached_tokens)
        return cls(
            model_call_id=raw.model_call_id,
            response_id=normalized.response_id,
            call_index=call_index,
            model_ref=_server_ref(raw.model_ref),
            model=normalized.model or request_model,
            dialect=raw.dialect,
            status_code=raw.status_code,
            response_status=normalized.response_status,
            finish_reason=normalized.finish_reason,
            started_at=raw.started_at,
            completed_at=raw.completed_at,
            tokens_in=usage.tokens_in,
            tokens_out=usage.tokens_out,
            tokens_reasoning=usage.tokens_reasoning,
            tokens_total=usage.tokens_total,
            cached_tokens=cached,
            cache_creation_tokens=usage.cache_creation_tokens,
            cache_hit=None if cached is None else cached > 0,
            tool_calls=[call.to_dict() for call in normalized.tool_calls],
            reasoning_content=normalized.reasoning_content,
            error_category=raw.error_category,
            latency_total_ms=raw.latency_ms,
            latency_ttft_ms=raw.latency_ttft_ms,
            client_session_id=raw.client_session_id,
            upstream_attempted=raw.upstream_attempted,
            response_source=raw.response_source,
            upstream_status_code=raw.upstream_status_code,
            local_response_reason=raw.local_response_reason,
            request=raw.request,
            response=raw.response,
            request_raw=raw.request_raw,
            response_raw=raw.response_raw,
        )

    def to_dict(self, *, payloads: bool = True) -> dict[str, Any]:
        """The record as a JSON object; ``payloads=False`` drops request/response and raw texts."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if not payloads:
            for key in _PAYLOAD_KEYS:
                del out[key]
        return out


_PAYLOAD_KEYS = ("request", "response", "request_raw", "response_raw")


def _server_ref(value: Mapping[str, Any]) -> dict[str, str] | None:
    """``{type, name}`` when ``value`` names a model server, else ``None`` (unknown)."""
    name = value.get("name")
    if value.get("type") != MODEL_REF_TYPE or not isinstance(name, str):
        return None
    return {"type": MODEL_REF_TYPE, "name": name}
