"""Captured calls as OpenTelemetry GenAI spans: ids, attributes, events, chunks (pure).

One trace per rollout attempt: a root ``invoke_agent`` span (kind INTERNAL) and, as its
children, one ``chat {model}`` span (kind CLIENT) per captured call, in file order. The spans are
plain ``SpanData`` values; turning them into SDK objects and sending them is the shell's job
(``_otel_sdk``), so this module imports nothing of OpenTelemetry.

Ids are derived, never drawn, so exporting a directory twice gives the same ids and a backend
that upserts by id keeps one copy: the trace id is the first 16 bytes of
``sha256(run_key + US + rollout_id)``, a call's span id the first 8 bytes of
``sha256(run_key + US + rollout_id + US + model_call_id)`` and the root's span id the first 8
bytes of ``sha256(run_key + US + rollout_id + US + "invoke_agent")`` (US is the ASCII unit
separator, 0x1F). A call without a ``model_call_id``, or with one an earlier line of the file
already used, is keyed by its line instead.

Attributes follow the GenAI semantic conventions where they name the value, ``rollcap.*``
otherwise. A value the record does not know is left out, never written as 0. Request and answer
content is left out unless ``ContentMode.FULL`` (the four opt-in attributes, as JSON, each cut to
``max_content_bytes``) or ``ContentMode.REF`` (the capture file and line that hold it) asks.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rollcap._json import as_count, as_dict, as_str
from rollcap.records import Gap, ModelCallRecord, RawRecord, error_category, is_streamed
from rollcap.report._otel_content import (
    cap_json_list,
    input_messages,
    output_messages,
    system_instructions,
    tool_definitions,
)

__all__ = [
    "DEFAULT_MAX_CONTENT_BYTES",
    "MAX_CHUNK_BYTES",
    "MAX_SPANS_PER_CHUNK",
    "AttributeValue",
    "ContentMode",
    "ExportOptions",
    "RolloutInfo",
    "SpanData",
    "SpanEventData",
    "call_span_id",
    "chunked",
    "estimated_size",
    "rollout_spans",
    "root_span_id",
    "trace_id",
]

DEFAULT_MAX_CONTENT_BYTES = 256 * 1024
# The SDK's batch processor sends at most 512 spans a request; receivers are sized for that.
MAX_SPANS_PER_CHUNK = 512
# Far below the exporter's own 64 MiB refusal and the request limits receivers commonly set,
# so a chunk of content-heavy spans is split rather than refused whole.
MAX_CHUNK_BYTES = 4 * 1024 * 1024

AttributeValue = str | bool | int | float | list[str]
SpanKindName = Literal["internal", "client"]

_SEP = "\x1f"
_NS = 1_000_000_000
_DESCRIPTION_LIMIT = 1024


class ContentMode(enum.StrEnum):
    NONE = "none"
    FULL = "full"
    REF = "ref"


@dataclass(frozen=True, slots=True)
class ExportOptions:
    """``run_key``: the capture directory's identity, part of every id."""

    run_key: str
    content: ContentMode = ContentMode.NONE
    max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES

    def __post_init__(self) -> None:
        if not self.run_key:
            raise ValueError("the run key must not be empty")
        if self.max_content_bytes < 1:
            raise ValueError(f"max content bytes must be at least 1, got {self.max_content_bytes}")


@dataclass(frozen=True, slots=True)
class RolloutInfo:
    """What collection's output says about one rollout attempt; ``None`` where it says nothing.

    ``error_type`` and ``error_message`` come from a line of the failures file.
    """

    rollout_id: str
    task_index: int | None = None
    rollout_index: int | None = None
    attempt_index: int | None = None
    reward: float | None = None
    agent: str | None = None
    error_type: str | None = None
    error_message: str | None = None

    @classmethod
    def from_line(cls, line: Mapping[str, Any]) -> RolloutInfo | None:
        """A rollout line or a failure line; ``None`` when it has no string ``rollout_id``."""
        rollout_id = as_str(line.get("rollout_id"))
        if not rollout_id:
            return None
        reward = line.get("reward")
        error = as_dict(line.get("error"))
        return cls(
            rollout_id=rollout_id,
            task_index=as_count(line.get("_ng_task_index")),
            rollout_index=as_count(line.get("_ng_rollout_index")),
            attempt_index=as_count(line.get("_ng_attempt_index")),
            reward=(
                float(reward)
                if isinstance(reward, int | float) and not isinstance(reward, bool)
                else None
            ),
            agent=as_str(as_dict(line.get("agent_ref")).get("name")),
            error_type=as_str(error.get("kind")) if error else None,
            error_message=as_str(error.get("message")) if error else None,
        )


@dataclass(frozen=True, slots=True)
class SpanEventData:
    name: str
    time_ns: int
    attributes: dict[str, AttributeValue] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SpanData:
    """One finished span. ``error`` sets status ERROR (with ``status_description``)."""

    name: str
    trace_id: int
    span_id: int
    parent_span_id: int | None
    kind: SpanKindName
    start_ns: int
    end_ns: int
    attributes: dict[str, AttributeValue]
    events: tuple[SpanEventData, ...] = ()
    error: bool = False
    status_description: str | None = None


def _digest(*parts: str) -> bytes:
    return hashlib.sha256(_SEP.join(parts).encode()).digest()


def _nonzero(value: int) -> int:
    # An all-zero id is invalid in OTLP; one chance in 2**64 of a digest, but never sent.
    return value or 1


def trace_id(run_key: str, rollout_id: str) -> int:
    return _nonzero(int.from_bytes(_digest(run_key, rollout_id)[:16], "big"))


def call_span_id(run_key: str, rollout_id: str, call_key: str) -> int:
    return _nonzero(int.from_bytes(_digest(run_key, rollout_id, call_key)[:8], "big"))


def root_span_id(run_key: str, rollout_id: str) -> int:
    return call_span_id(run_key, rollout_id, "invoke_agent")


def _ns(seconds: float) -> int:
    return round(seconds * _NS)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _strings(value: object) -> list[str] | None:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _set(attributes: dict[str, AttributeValue], key: str, value: AttributeValue | None) -> None:
    if value is not None:
        attributes[key] = value


_PROVIDERS = {"chat": "openai", "responses": "openai", "messages": "anthropic"}
_OPENAI_API_TYPES = {"chat": "chat_completions", "responses": "responses"}
_MAX_TOKENS_KEYS = {
    "chat": ("max_completion_tokens", "max_tokens"),
    "responses": ("max_output_tokens",),
    "messages": ("max_tokens",),
}


def _request_attributes(
    record: ModelCallRecord, streamed: bool, out: dict[str, AttributeValue]
) -> None:
    request = record.request
    if request is None:
        return
    dialect = record.dialect
    _set(out, "gen_ai.request.model", as_str(request.get("model")))
    out["gen_ai.request.stream"] = streamed
    _set(out, "gen_ai.request.temperature", _number(request.get("temperature")))
    _set(out, "gen_ai.request.top_p", _number(request.get("top_p")))
    for key in _MAX_TOKENS_KEYS.get(dialect, ()):
        if (limit := as_count(request.get(key))) is not None:
            out["gen_ai.request.max_tokens"] = limit
            break
    if dialect == "chat":
        _set(out, "gen_ai.request.seed", _integer(request.get("seed")))
        _set(out, "gen_ai.request.stop_sequences", _strings(request.get("stop")))
        _set(out, "gen_ai.request.frequency_penalty", _number(request.get("frequency_penalty")))
        _set(out, "gen_ai.request.presence_penalty", _number(request.get("presence_penalty")))
        choices = as_count(request.get("n"))
        if choices is not None and choices != 1:
            out["gen_ai.request.choice.count"] = choices
    elif dialect == "messages":
        _set(out, "gen_ai.request.stop_sequences", _strings(request.get("stop_sequences")))
        _set(out, "gen_ai.request.top_k", _number(request.get("top_k")))


def _finish_reasons(record: ModelCallRecord) -> list[str] | None:
    if record.dialect == "chat" and record.response is not None:
        choices = record.response.get("choices")
        reasons = [
            reason
            for choice in (choices if isinstance(choices, list) else ())
            if (reason := as_str(as_dict(choice).get("finish_reason"))) is not None
        ]
        if reasons:
            return reasons
    return [record.finish_reason] if record.finish_reason is not None else None


def _response_attributes(
    record: ModelCallRecord, streamed: bool, out: dict[str, AttributeValue]
) -> None:
    _set(out, "gen_ai.response.id", record.response_id)
    if record.response is not None:
        _set(out, "gen_ai.response.model", as_str(record.response.get("model")))
        names = [name for call in record.tool_calls if isinstance(name := call.get("name"), str)]
        out["rollcap.tool_call.names"] = names
    _set(out, "gen_ai.response.finish_reasons", _finish_reasons(record))
    _set(out, "gen_ai.usage.input_tokens", record.tokens_in)
    _set(out, "gen_ai.usage.output_tokens", record.tokens_out)
    _set(out, "gen_ai.usage.reasoning.output_tokens", record.tokens_reasoning)
    _set(out, "gen_ai.usage.cache_read.input_tokens", record.cached_tokens)
    _set(out, "gen_ai.usage.cache_creation.input_tokens", record.cache_creation_tokens)
    if streamed and record.latency_ttft_ms is not None:
        # Measured at the proxy: the first byte from the upstream, not the first token shown.
        # A buffered answer's first byte is its whole latency, which the convention leaves out.
        out["gen_ai.response.time_to_first_chunk"] = record.latency_ttft_ms / 1000.0
    _set(out, "http.response.status_code", record.status_code)


def _content_attributes(
    record: ModelCallRecord, options: ExportOptions, out: dict[str, AttributeValue]
) -> None:
    values = (
        ("gen_ai.system_instructions", system_instructions(record.dialect, record.request)),
        ("gen_ai.input.messages", input_messages(record.dialect, record.request)),
        (
            "gen_ai.output.messages",
            output_messages(record.dialect, record.response, record.finish_reason),
        ),
        ("gen_ai.tool.definitions", tool_definitions(record.dialect, record.request)),
    )
    truncated = False
    for key, items in values:
        if items is None:
            continue
        text, cut = cap_json_list(items, options.max_content_bytes)
        out[key] = text
        truncated = truncated or cut
    if truncated:
        out["rollcap.content_truncated"] = True


def _gap_event(gap: Gap, time_ns: int) -> SpanEventData:
    attributes: dict[str, AttributeValue] = {"code": gap.code}
    _set(attributes, "detail", gap.detail)
    _set(attributes, "invocation_id", gap.invocation_id)
    return SpanEventData("rollcap.gap", time_ns, attributes)


def _record_gaps(raw: RawRecord) -> list[Gap]:
    gaps = []
    for item in raw.gaps or ():
        code = as_str(item.get("code"))
        if code is not None:
            detail, invocation = as_str(item.get("detail")), as_str(item.get("invocation_id"))
            gaps.append(Gap(code, detail, invocation))
    return gaps


def _times(raw: RawRecord) -> tuple[int, int] | None:
    """The call's start and end in ns; a missing (non-positive) one is taken from the other."""
    start = raw.started_at if raw.started_at > 0 else raw.completed_at
    end = raw.completed_at if raw.completed_at > 0 else raw.started_at
    if start <= 0:
        return None
    return _ns(start), max(_ns(end), _ns(start))


def _call_span(
    rollout_id: str,
    line_index: int,
    call_key: str,
    raw: RawRecord,
    times: tuple[int, int],
    options: ExportOptions,
    capture_file: str | None,
) -> SpanData:
    record = ModelCallRecord.from_raw(raw, line_index)
    attributes: dict[str, AttributeValue] = {"gen_ai.operation.name": "chat"}
    _set(attributes, "gen_ai.provider.name", _PROVIDERS.get(record.dialect))
    _set(attributes, "openai.api.type", _OPENAI_API_TYPES.get(record.dialect))
    attributes["gen_ai.conversation.id"] = rollout_id
    streamed = is_streamed(raw.request, raw.transport)
    _request_attributes(record, streamed, attributes)
    _response_attributes(record, streamed, attributes)
    category = record.error_category
    if category is None and record.status_code is not None and record.status_code >= 400:
        found = error_category(record.status_code)
        category = None if found is None else found.value
    _set(attributes, "error.type", category)
    _set(attributes, "rollcap.model_call_id", record.model_call_id or None)
    _set(attributes, "rollcap.client_session_id", record.client_session_id)
    attributes["rollcap.call_index"] = line_index
    model_ref = record.model_ref or {}
    _set(attributes, "rollcap.model_ref.name", as_str(model_ref.get("name")))
    if options.content is ContentMode.FULL:
        _content_attributes(record, options, attributes)
    elif options.content is ContentMode.REF and capture_file is not None:
        attributes["rollcap.capture.file"] = capture_file
        attributes["rollcap.capture.line"] = line_index + 1
    model = as_str((record.request or {}).get("model")) or record.model
    start_ns, end_ns = times
    return SpanData(
        name=f"chat {model}" if model else "chat",
        trace_id=trace_id(options.run_key, rollout_id),
        span_id=call_span_id(options.run_key, rollout_id, call_key),
        parent_span_id=root_span_id(options.run_key, rollout_id),
        kind="client",
        start_ns=start_ns,
        end_ns=end_ns,
        attributes=attributes,
        events=tuple(_gap_event(gap, end_ns) for gap in _record_gaps(raw)),
        error=category is not None,
    )


def rollout_spans(
    rollout_id: str,
    records: Sequence[tuple[int, Mapping[str, Any]]],
    options: ExportOptions,
    *,
    info: RolloutInfo | None = None,
    gaps: Sequence[Gap] = (),
    capture_file: str | None = None,
) -> list[SpanData]:
    """The rollout's root span, then one span per call in file order.

    ``records`` are ``(line_index, raw record)`` pairs as ``CaptureStore.read_available`` gives
    them; ``gaps`` are the rollout's own (unreadable lines, the incomplete marker) and become
    ``rollcap.gap`` events on the root, as a record's gaps do on its call's span. A call with no
    time at all starts and ends with the rollout and says so (``rollcap.timing_unknown``). A
    rollout none of whose calls has a time cannot be placed on a timeline: ``[]``.
    """
    timed = [(index, raw, _times(raw)) for index, raw in _raws(records)]
    known = [times for _, _, times in timed if times is not None]
    if not known:
        return []
    start_ns = min(start for start, _ in known)
    end_ns = max(end for _, end in known)
    calls: list[SpanData] = []
    seen: set[str] = set()
    for index, raw, times in timed:
        key = raw.model_call_id
        if not key or key in seen:
            key = f"{key}{_SEP}line-{index}"
        seen.add(key)
        span = _call_span(
            rollout_id, index, key, raw, times or (start_ns, start_ns), options, capture_file
        )
        if times is None:
            span.attributes["rollcap.timing_unknown"] = True
        calls.append(span)
    return [_root_span(rollout_id, start_ns, end_ns, len(calls), options, info, gaps), *calls]


def _raws(records: Sequence[tuple[int, Mapping[str, Any]]]) -> Iterator[tuple[int, RawRecord]]:
    for index, obj in records:
        yield index, RawRecord.from_json(obj)


def _root_span(
    rollout_id: str,
    start_ns: int,
    end_ns: int,
    num_calls: int,
    options: ExportOptions,
    info: RolloutInfo | None,
    gaps: Sequence[Gap],
) -> SpanData:
    info = info or RolloutInfo(rollout_id)
    attributes: dict[str, AttributeValue] = {"gen_ai.operation.name": "invoke_agent"}
    _set(attributes, "gen_ai.agent.name", info.agent)
    attributes["gen_ai.conversation.id"] = rollout_id
    attributes["rollcap.rollout_id"] = rollout_id
    _set(attributes, "rollcap.task_index", info.task_index)
    _set(attributes, "rollcap.rollout_index", info.rollout_index)
    _set(attributes, "rollcap.attempt_index", info.attempt_index)
    _set(attributes, "rollcap.reward", info.reward)
    attributes["rollcap.num_calls"] = num_calls
    _set(attributes, "error.type", info.error_type)
    description = info.error_message
    if description is not None and len(description) > _DESCRIPTION_LIMIT:
        description = description[: _DESCRIPTION_LIMIT - 3] + "..."
    return SpanData(
        name=f"invoke_agent {info.agent or 'rollout'}",
        trace_id=trace_id(options.run_key, rollout_id),
        span_id=root_span_id(options.run_key, rollout_id),
        parent_span_id=None,
        kind="internal",
        start_ns=start_ns,
        end_ns=end_ns,
        attributes=attributes,
        events=tuple(_gap_event(gap, end_ns) for gap in gaps),
        error=info.error_type is not None,
        status_description=description if info.error_type is not None else None,
    )


def _value_size(value: AttributeValue) -> int:
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, list):
        return sum(len(item.encode()) + 2 for item in value)
    return 9


def estimated_size(span: SpanData) -> int:
    """About how many bytes the span takes in an OTLP request (an upper estimate for ids and
    numbers, exact for text)."""
    size = 64 + len(span.name) + len(span.status_description or "")
    for key, value in span.attributes.items():
        size += 8 + len(key) + _value_size(value)
    for event in span.events:
        size += 16 + len(event.name)
        for key, value in event.attributes.items():
            size += 8 + len(key) + _value_size(value)
    return size


def chunked(
    spans: Iterable[SpanData],
    max_spans: int = MAX_SPANS_PER_CHUNK,
    max_bytes: int = MAX_CHUNK_BYTES,
) -> Iterator[list[SpanData]]:
    """``spans`` in order, in chunks of at most ``max_spans`` spans and, unless a single span is
    larger on its own, at most ``max_bytes`` estimated bytes."""
    if max_spans < 1 or max_bytes < 1:
        raise ValueError("a chunk holds at least one span and one byte")
    chunk: list[SpanData] = []
    size = 0
    for span in spans:
        span_size = estimated_size(span)
        if chunk and (len(chunk) >= max_spans or size + span_size > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(span)
        size += span_size
    if chunk:
        yield chunk
