"""Types and helpers shared by the dialect modules (pure).

Each dialect module (``responses``, ``chat``, ``messages``) exposes the same six names, which
the registry (``rollcap.dialects``) gathers into one ``Dialect`` record:

- ``NAME``: the dialect's name as written in a raw record's ``dialect`` field.
- ``normalize(response) -> Normalized``: read ids, status, usage, tool calls and reasoning from a
  complete (non-streamed or reassembled) response object. Never raises, whatever the input.
- ``is_terminal_event(event) -> bool``: true for the event that ends a stream of this dialect
  (the one the model server holds back until the call's record is durable).
- ``StreamReassembler``: ``feed(event)`` for each decoded SSE event, then ``finish()`` returns a
  ``Reassembly``: the object the non-streaming API would have returned (partial when the stream was
  cut) and how the stream ended. Neither method raises, whatever the input. ``size`` is about how
  many bytes it holds so far (see ``StreamReassembler``), so a caller can bound it.
- ``usage(response) -> Usage``: only the token counts of ``normalize``, for aggregation.
- ``error_body(kind, message) -> dict``: an error answer in the dialect's own shape, as its SDKs
  parse it; ``kind`` is the error's type (``invalid_request_error``, ``timeout``...).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from rollcap._json import as_count, as_dict
from rollcap.sse import SSEEvent

__all__ = [
    "PIECE_OVERHEAD",
    "Normalized",
    "Reassembly",
    "StreamOutcome",
    "StreamReassembler",
    "ToolCall",
    "Usage",
    "cached_count",
    "context_length_exceeded",
    "error_message",
    "kept_piece",
    "openai_error",
    "openai_usage",
    "parse_arguments",
    "reasoning_count",
    "total_tokens",
]


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts after the contract's rules: ``None`` is unknown, never zero."""

    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_reasoning: int | None = None
    tokens_total: int | None = None
    cached_tokens: int | None = None
    cache_creation_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the model made. ``arguments`` is parsed JSON, or ``{"_raw": text}``."""

    call_id: str | None
    name: str | None
    arguments: Any

    def to_dict(self) -> dict[str, Any]:
        return {"call_id": self.call_id, "name": self.name, "arguments": self.arguments}


@dataclass(frozen=True, slots=True)
class Normalized:
    """What a response says, read the same way for every dialect."""

    response_id: str | None = None
    model: str | None = None
    response_status: str | None = None
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning_content: str | None = None


class StreamOutcome(enum.Enum):
    """How a stream ended, as far as its events tell."""

    COMPLETED = "completed"  # the dialect's terminal event arrived, no error
    INCOMPLETE = "incomplete"  # Responses ``response.incomplete``
    ERROR = "error"  # an error event (or Responses ``response.failed``)
    TRUNCATED = "truncated"  # closed without the terminal event


@dataclass(frozen=True, slots=True)
class Reassembly:
    """The result of reassembling one stream."""

    response: dict[str, Any] | None
    outcome: StreamOutcome
    error: dict[str, Any] | None = None

    @property
    def truncated(self) -> bool:
        return self.outcome is StreamOutcome.TRUNCATED


class StreamReassembler(Protocol):
    """``size``: about how many bytes of memory what was fed so far holds, an estimate that errs
    high: each text piece kept counts its length plus ``PIECE_OVERHEAD``, anything kept whole (a
    parsed object, a deferred event) the length of the event data it came in plus the same."""

    size: int

    def feed(self, event: SSEEvent) -> None: ...

    def finish(self) -> Reassembly: ...


# What holding one more small piece costs beyond its text: a str object's header and the list
# slot that holds it (about 57 bytes in CPython), rounded up.
PIECE_OVERHEAD = 64


def kept_piece(text: str) -> int:
    """``size``'s share of one text piece kept."""
    return len(text) + PIECE_OVERHEAD


def total_tokens(reported: object, tokens_in: int | None, tokens_out: int | None) -> int | None:
    """The provider's total when it reports one, else in + out when both are known."""
    total = as_count(reported)
    if total is None and tokens_in is not None and tokens_out is not None:
        total = tokens_in + tokens_out
    return total


def _first_detail_count(
    usage: Mapping[str, Any], details: tuple[str, ...], keys: tuple[str, ...]
) -> int | None:
    """The first count among ``keys`` of the objects ``details`` names, tried in order."""
    for name in details:
        holder = as_dict(usage.get(name))
        for key in keys:
            count = as_count(holder.get(key))
            if count is not None:
                return count
    return None


def cached_count(usage: Mapping[str, Any]) -> int | None:
    """The cached input count of any dialect's usage, the first count found in NeMo Gym's order.

    ``cached_tokens`` then ``cached_input_tokens`` under ``prompt_tokens_details`` (Chat), then
    the same under ``input_tokens_details`` (Responses); then ``cache_read_input_tokens``
    (Anthropic), then a top-level ``cached_input_tokens`` (Codex-style usage). Reading every
    naming in every dialect is what lets a file read the same here and in NeMo Gym. A value
    that is not a count is passed over, not taken as unknown.
    """
    count = _first_detail_count(
        usage,
        ("prompt_tokens_details", "input_tokens_details"),
        ("cached_tokens", "cached_input_tokens"),
    )
    for key in ("cache_read_input_tokens", "cached_input_tokens"):
        if count is None:
            count = as_count(usage.get(key))
    return count


def reasoning_count(usage: Mapping[str, Any]) -> int | None:
    """The reasoning output count of an OpenAI usage object, the first found in NeMo Gym's order.

    ``reasoning_tokens`` under ``output_tokens_details`` (Responses) then under
    ``completion_tokens_details`` (Chat), then a top-level ``reasoning_output_tokens``
    (Codex-style usage).
    """
    count = _first_detail_count(
        usage, ("output_tokens_details", "completion_tokens_details"), ("reasoning_tokens",)
    )
    return count if count is not None else as_count(usage.get("reasoning_output_tokens"))


def openai_usage(usage: Mapping[str, Any], inputs: str, outputs: str) -> Usage:
    """An OpenAI usage object. Chat names its counts prompt/completion, Responses input/output;
    the rules are the same. Cached tokens are already inside the input count: reported on their
    own, never added in. The cached and reasoning counts are read under either API's names
    (``cached_count``, ``reasoning_count``)."""
    tokens_in = as_count(usage.get(f"{inputs}_tokens"))
    tokens_out = as_count(usage.get(f"{outputs}_tokens"))
    return Usage(
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        tokens_reasoning=reasoning_count(usage),
        tokens_total=total_tokens(usage.get("total_tokens"), tokens_in, tokens_out),
        cached_tokens=cached_count(usage),
        cache_creation_tokens=None,
    )


def parse_arguments(value: object) -> Any:
    """Tool-call arguments: a JSON string is parsed, other text becomes ``{"_raw": text}``.

    Arguments that are already structured (Anthropic ``input``) are returned as they are.
    """
    if not isinstance(value, str):
        return value
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return {"_raw": value}


def openai_error(
    message: str,
    *,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """An OpenAI-shaped error object, the shape every OpenAI SDK parses (Chat and Responses).

    ``extra`` fields go into the error object after the four the API always sends.
    """
    return {"error": {"message": message, "type": kind, "param": param, "code": code, **extra}}


def error_message(body: Mapping[str, Any]) -> str | None:
    """The message of an error body in any dialect's shape: ``error.message`` (OpenAI,
    Anthropic), an ``error`` that is itself a string, or a top-level ``message``."""
    error = body.get("error")
    for candidate in (as_dict(error).get("message"), error, body.get("message")):
        if isinstance(candidate, str) and candidate:
            return candidate
    return None


# How upstreams word a prompt that does not fit the model's context, lower-cased: OpenAI
# ("maximum context length", "exceeds the context window"), vLLM ("maximum context length",
# "longer than the maximum model length"), Anthropic ("prompt is too long").
_CONTEXT_PHRASES = (
    "context length",
    "context window",
    "maximum model length",
    "prompt is too long",
)
_CONTEXT_LENGTH_CODE = "context_length_exceeded"


def context_length_exceeded(status: int | None, body: Mapping[str, Any] | None) -> bool:
    """Whether an error answer says the prompt is longer than the model's context.

    Only a 400 or 413 says so: its error ``code`` is ``context_length_exceeded`` (OpenAI,
    the embedded model), or its message (``error_message``) names the context in one of the
    ways OpenAI, vLLM and Anthropic word it.
    """
    if status not in (400, 413) or body is None:
        return False
    error = body.get("error")
    for holder in (error if isinstance(error, Mapping) else {}, body):
        if holder.get("code") == _CONTEXT_LENGTH_CODE:
            return True
    message = error_message(body)
    if message is None:
        return False
    lowered = message.lower()
    return any(phrase in lowered for phrase in _CONTEXT_PHRASES)
