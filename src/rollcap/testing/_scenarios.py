"""What the fake upstream answers, built without any I/O (pure).

``answer(dialect, raw_body, headers, request_id=..., api_key=...)`` turns one request into a
``Reply``: a status, headers, and either a body or the encoded SSE frames of a stream, plus what the
shell must do besides sending them (wait first, pause between frames, cut the connection, hang,
drop it). The shell in ``_server`` only carries a ``Reply`` out.

A request is answered by a *scenario*: the ``x-fake-scenario`` header, else the request's ``model``
when it names a scenario, else ``text``. Scenarios and knobs are listed in ``SCENARIOS`` and the
``HEADER_*`` constants; the package docstring describes them for users.

Determinism: ids and timestamps come from a hash of the request body with ``stream`` and
``stream_options`` left out, so the same request gets the same ids streamed or not. A non-streamed
answer is exactly what ``rollcap.dialects.reassemble`` rebuilds from the streamed answer to the same
request (for chat, when the stream asked for usage with ``stream_options.include_usage``).

Token ids: a chat request with ``"return_token_ids": true`` also gets vLLM's token fields, from
the fake tokenizer in ``_tokens`` (``Plan.tokens``), and its usage counts those ids (no reasoning
tokens: the reasoning is not among them). ``reassemble`` rebuilds neither ``prompt_token_ids``
nor ``token_ids`` from a stream and adds ``"refusal": null`` to the logprobs; apart from that the
equality above holds for such a request too.

Token counts: ``input`` is ceil(chars / 4) of the request's text (the string values of ``input`` and
``instructions``, of ``messages``, and of ``system``; ``role`` and ``type`` values left out), at
least 1. Half of it (or ``x-fake-cached-tokens``) is reported as cached. ``output`` is ceil(chars /
4) of the answer's text and tool arguments (at least 1) plus the reasoning tokens, ceil(chars / 4)
of the reasoning text. Every dialect reports the same totals: Anthropic's ``input_tokens`` is the
input less the cached part, which it reports as ``cache_read_input_tokens``.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import orjson

from rollcap._json import as_dict, as_str
from rollcap.dialects.chat import wants_stream_usage
from rollcap.sse import SSEEvent, encode_event
from rollcap.testing import _tokens as tokenizer

__all__ = [
    "DEFAULT_MODEL",
    "DIALECTS",
    "HEADER_CACHED_TOKENS",
    "HEADER_CHUNK_DELAY_MS",
    "HEADER_CONTENT_BYTES",
    "HEADER_DELAY_MS",
    "HEADER_EVENTS",
    "HEADER_SCENARIO",
    "SCENARIOS",
    "Finish",
    "KnobError",
    "Knobs",
    "Plan",
    "PlannedUsage",
    "Reply",
    "ReplyKind",
    "TokenPlan",
    "ToolPlan",
    "answer",
    "error_reply",
    "expected_response",
    "is_authorized",
    "models_list",
    "plan_answer",
    "read_knobs",
]

DIALECTS: Final = ("responses", "chat", "messages")
DEFAULT_MODEL: Final = "fake-model"

HEADER_SCENARIO: Final = "x-fake-scenario"
HEADER_EVENTS: Final = "x-fake-events"
HEADER_CONTENT_BYTES: Final = "x-fake-content-bytes"
HEADER_CACHED_TOKENS: Final = "x-fake-cached-tokens"
HEADER_DELAY_MS: Final = "x-fake-delay-ms"
HEADER_CHUNK_DELAY_MS: Final = "x-fake-chunk-delay-ms"

# Scenarios that complete (their stream ends with the dialect's terminal event).
_COMPLETING = ("text", "tool", "reasoning", "incomplete")
_FAILING = ("malformed_json", "truncate", "stream_error", "hang", "disconnect")
_HTTP_ERRORS = ("http_400", "http_401", "http_404", "http_429", "http_500", "http_503")
SCENARIOS: Final = _COMPLETING + _FAILING + _HTTP_ERRORS
"""The named scenarios. Besides these, ``http_<status>`` answers any status from 400 to 599."""

# Upper bounds on the knobs, so that a typo cannot make the fake build gigabytes.
_MAX_EVENTS = 1_000_000
_MAX_BYTES = 100_000_000
_MAX_DELAY_MS = 3_600_000.0

_DEFAULT_TEXT = "Hello! This is the rollcap fake upstream answering your request."
_REASONING_TEXT = (
    "The request came to the fake upstream. A short, friendly sentence answers it best."
)
_FILLER = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india")
_TOOL_PIECE_CHARS = 12
_DEFAULT_TOOL = "lookup"
_SKIPPED_TEXT_KEYS = frozenset({"role", "type"})


# --- knobs ----------------------------------------------------------------------------------------


class KnobError(ValueError):
    """A request header or body that selects something the fake does not have."""


@dataclass(frozen=True, slots=True)
class Knobs:
    """What the request asks of the fake, read from its ``x-fake-*`` headers and its model."""

    scenario: str = "text"
    events: int | None = None
    content_bytes: int | None = None
    cached_tokens: int | None = None
    delay_s: float = 0.0
    chunk_delay_s: float = 0.0


def _http_status(scenario: str) -> int | None:
    match = re.fullmatch(r"http_([45]\d\d)", scenario)
    return int(match.group(1)) if match else None


def _is_scenario(name: str) -> bool:
    return name in SCENARIOS or _http_status(name) is not None


def _count(headers: Mapping[str, str], name: str, limit: int) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or int(text) > limit:
        raise KnobError(f"{name} must be an integer from 0 to {limit}, got {value!r}")
    return int(text)


def _delay(headers: Mapping[str, str], name: str) -> float:
    value = headers.get(name)
    if value is None:
        return 0.0
    try:
        ms = float(value)
    except ValueError:
        ms = math.nan
    if not 0.0 <= ms <= _MAX_DELAY_MS:  # also false for NaN
        raise KnobError(f"{name} must be a number of milliseconds from 0 to {_MAX_DELAY_MS:g}")
    return ms / 1000.0


def read_knobs(headers: Mapping[str, str], body: Mapping[str, Any]) -> Knobs:
    """Read the knobs; ``headers`` is case-insensitive or has lower-case names.

    Raises ``KnobError`` for an unknown scenario or a header value out of range.
    """
    scenario = headers.get(HEADER_SCENARIO)
    if scenario is not None:
        scenario = scenario.strip()
        if not _is_scenario(scenario):
            raise KnobError(
                f"unknown {HEADER_SCENARIO} {scenario!r}: expected one of "
                f"{', '.join(SCENARIOS)} or http_<status>"
            )
    else:
        model = as_str(body.get("model"))
        scenario = model if model is not None and _is_scenario(model) else "text"
    return Knobs(
        scenario=scenario,
        events=_count(headers, HEADER_EVENTS, _MAX_EVENTS),
        content_bytes=_count(headers, HEADER_CONTENT_BYTES, _MAX_BYTES),
        cached_tokens=_count(headers, HEADER_CACHED_TOKENS, _MAX_BYTES),
        delay_s=_delay(headers, HEADER_DELAY_MS),
        chunk_delay_s=_delay(headers, HEADER_CHUNK_DELAY_MS),
    )


# --- the answer, before any dialect --------------------------------------------------------------


class Finish(enum.Enum):
    STOP = "stop"
    TOOL = "tool"
    LENGTH = "length"


@dataclass(frozen=True, slots=True)
class PlannedUsage:
    """Token counts for every dialect: input includes the cached part, output the reasoning."""

    input_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class ToolPlan:
    name: str
    arguments: str  # JSON text
    pieces: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TokenPlan:
    """Token ids for a chat request that asked for ``return_token_ids`` (see ``_tokens``)."""

    prompt: tuple[int, ...]
    generated: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    """One answer, dialect-neutral: what the model says and how a stream splits it."""

    seed: str
    model: str
    created: int
    text: str | None
    text_pieces: tuple[str, ...]
    reasoning: str | None
    reasoning_pieces: tuple[str, ...]
    tool: ToolPlan | None
    finish: Finish
    usage: PlannedUsage
    tokens: TokenPlan | None = None

    def ident(self, label: str, length: int) -> str:
        """A stable id fragment of ``length`` hex digits for this answer."""
        digest = hashlib.sha256(f"{self.seed}:{label}".encode()).hexdigest()
        return (digest * (1 + length // len(digest)))[:length]


def _seed(dialect: str, body: Mapping[str, Any]) -> str:
    same = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    try:
        canonical = orjson.dumps(same, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        canonical = repr(sorted(same.items(), key=lambda kv: kv[0])).encode()
    return hashlib.sha256(dialect.encode() + b"\n" + canonical).hexdigest()


def _tokens(chars: int) -> int:
    return math.ceil(chars / 4)


def _text_chars(value: object) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(_text_chars(v) for k, v in value.items() if k not in _SKIPPED_TEXT_KEYS)
    if isinstance(value, list):
        return sum(_text_chars(v) for v in value)
    return 0


def _word_pieces(text: str) -> tuple[str, ...]:
    """Split before each word; the pieces join back to ``text``."""
    return tuple(re.findall(r"\s*\S+|\s+$", text))


def _even_pieces(text: str, count: int) -> tuple[str, ...]:
    size = len(text)
    return tuple(text[size * i // count : size * (i + 1) // count] for i in range(count))


def _chunk_pieces(text: str, width: int) -> tuple[str, ...]:
    return tuple(text[i : i + width] for i in range(0, len(text), width)) or ("",)


def _filler(words: int) -> str:
    return " ".join(_FILLER[i % len(_FILLER)] for i in range(words))


def _sized(size: int) -> str:
    words = _filler(size // 5 + 2)
    while len(words) < size:
        words = f"{words} {words}"
    return words[:size]


def _answer_text(knobs: Knobs) -> tuple[str, tuple[str, ...]]:
    if knobs.events == 0:
        return "", ()
    if knobs.content_bytes is not None:
        text = _sized(knobs.content_bytes)
        if knobs.events is not None:
            return text, _even_pieces(text, knobs.events)
        return text, _word_pieces(text)
    if knobs.events is not None:
        text = _filler(knobs.events)
        return text, _word_pieces(text)
    return _DEFAULT_TEXT, _word_pieces(_DEFAULT_TEXT)


def _first_tool(body: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """The first named tool of the request, in any dialect's shape, and its parameter schema."""
    tools = body.get("tools")
    for raw in tools if isinstance(tools, list) else ():
        tool = as_dict(raw)
        function = as_dict(tool.get("function"))
        name = as_str(tool.get("name")) or as_str(function.get("name"))
        if name:
            schema = (
                tool.get("parameters") or tool.get("input_schema") or function.get("parameters")
            )
            return name, as_dict(schema)
    return _DEFAULT_TOOL, {}


def _sample_value(schema: Mapping[str, Any], name: str) -> Any:
    enum_values = schema.get("enum")
    if isinstance(enum_values, list) and enum_values:
        return enum_values[0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    samples: dict[object, Any] = {
        "integer": 1,
        "number": 1.5,
        "boolean": True,
        "array": [],
        "object": {},
        "null": None,
    }
    return samples.get(kind, f"example {name}")


def _sample_arguments(schema: Mapping[str, Any]) -> dict[str, Any]:
    properties = as_dict(schema.get("properties"))
    if not properties:
        return {"query": "example query"}
    required = schema.get("required")
    names = [n for n in required if n in properties] if isinstance(required, list) else []
    return {n: _sample_value(as_dict(properties[n]), n) for n in names or list(properties)}


def plan_answer(dialect: str, body: Mapping[str, Any], knobs: Knobs) -> Plan:
    """Decide the answer to ``body``: text, reasoning, tool call, finish and token counts.

    A chat request with ``"return_token_ids": true`` also gets its token ids (``Plan.tokens``),
    and its usage counts them; ``KnobError`` when its messages cannot be tokenized.
    """
    seed = _seed(dialect, body)
    text: str | None
    text, text_pieces = _answer_text(knobs)
    reasoning: str | None = None
    reasoning_pieces: tuple[str, ...] = ()
    tool: ToolPlan | None = None
    finish = Finish.STOP
    if knobs.scenario == "tool":
        name, schema = _first_tool(body)
        arguments = orjson.dumps(_sample_arguments(schema)).decode()
        pieces = (
            _even_pieces(arguments, knobs.events)
            if knobs.events is not None
            else _chunk_pieces(arguments, _TOOL_PIECE_CHARS)
        )
        tool = ToolPlan(name, arguments, pieces)
        text, text_pieces, finish = None, (), Finish.TOOL
    elif knobs.scenario == "reasoning":
        reasoning, reasoning_pieces = _REASONING_TEXT, _word_pieces(_REASONING_TEXT)
    elif knobs.scenario == "incomplete":
        text_pieces = text_pieces[: (len(text_pieces) + 1) // 2]
        text, finish = "".join(text_pieces), Finish.LENGTH

    tokens = _token_plan(body, text, tool) if dialect == "chat" else None
    if tokens is not None:
        # Counted in ids; the reasoning is not among the generated ids.
        input_tokens, reasoning_tokens = len(tokens.prompt), 0
        output_tokens = len(tokens.generated)
    else:
        input_chars = sum(
            _text_chars(body.get(key)) for key in ("input", "instructions", "messages", "system")
        )
        input_tokens = max(1, _tokens(input_chars))
        answer_chars = len(text or "") + (len(tool.arguments) if tool is not None else 0)
        reasoning_tokens = _tokens(len(reasoning)) if reasoning else 0
        output_tokens = max(1, _tokens(answer_chars)) + reasoning_tokens
    cached = input_tokens // 2 if knobs.cached_tokens is None else knobs.cached_tokens
    usage = PlannedUsage(
        input_tokens=input_tokens,
        cached_tokens=min(cached, input_tokens),
        output_tokens=output_tokens,
        reasoning_tokens=reasoning_tokens,
    )
    model = as_str(body.get("model")) or DEFAULT_MODEL
    return Plan(
        seed=seed,
        model=model,
        created=1_700_000_000 + int(seed[:8], 16) % 100_000_000,
        text=text,
        text_pieces=text_pieces,
        reasoning=reasoning,
        reasoning_pieces=reasoning_pieces,
        tool=tool,
        finish=finish,
        usage=usage,
        tokens=tokens,
    )


def _token_plan(
    body: Mapping[str, Any], text: str | None, tool: ToolPlan | None
) -> TokenPlan | None:
    """The token ids of a chat request with ``"return_token_ids": true``, else ``None``.

    Raises ``KnobError`` when the messages or the pinned prefix cannot be tokenized.
    """
    if body.get("return_token_ids") is not True:
        return None
    pinned = body.get(tokenizer.PREFIX_IDS_FIELD)
    if pinned is not None and not (
        isinstance(pinned, list)
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in pinned)
    ):
        raise KnobError(f"{tokenizer.PREFIX_IDS_FIELD} must be null or a list of token ids")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise KnobError("messages must be a list to return token ids")
    try:
        prompt = tokenizer.render_prompt(messages, prefix_ids=pinned)
    except ValueError as exc:
        raise KnobError(f"messages cannot be tokenized: {exc}") from None
    answer_body = text or ""
    if tool is not None:
        answer_body += tokenizer.tool_call_text(tool.name, tool.arguments)
    return TokenPlan(tuple(prompt), tuple(tokenizer.generated_ids(answer_body)))


# --- replies -------------------------------------------------------------------------------------


class ReplyKind(enum.Enum):
    BODY = "body"  # a status and a body
    STREAM = "stream"  # a 200 and SSE frames
    HANG = "hang"  # never answer, until the client leaves or the server stops
    DISCONNECT = "disconnect"  # close the connection without answering


Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Reply:
    """What to send. ``cut``: close the connection after ``body`` / ``events`` without finishing
    the response; a cut body announces ``declared_length`` bytes and sends fewer."""

    kind: ReplyKind
    status: int = 200
    headers: Headers = ()
    body: bytes = b""
    events: tuple[bytes, ...] = ()
    declared_length: int | None = None
    cut: bool = False
    delay_s: float = 0.0
    chunk_delay_s: float = 0.0


_JSON = "application/json"
_SSE = "text/event-stream; charset=utf-8"


def _headers(dialect: str, request_id: str, content_type: str) -> Headers:
    if dialect == "messages":
        extra: Headers = (("request-id", request_id),)
    else:
        extra = (
            ("x-request-id", request_id),
            ("openai-version", "2020-10-01"),
            ("openai-processing-ms", "1"),
        )
    if content_type == _SSE:
        extra += (("cache-control", "no-cache"),)
    return (("content-type", content_type), *extra)


# status -> (type, code, message) for the OpenAI dialects; Anthropic uses the type and message.
_OPENAI_ERRORS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "The fake upstream was asked to refuse this request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("invalid_request_error", "unsupported_country_region_territory", "Not allowed."),
    404: ("invalid_request_error", "model_not_found", "The model does not exist."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests."),
    500: ("server_error", None, "The server had an error while processing your request."),
    503: ("server_error", None, "The engine is currently overloaded, please try again later."),
}
_ANTHROPIC_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "The fake upstream was asked to refuse this request."),
    401: ("authentication_error", "invalid x-api-key"),
    403: ("permission_error", "Your API key does not have permission to use this resource."),
    404: ("not_found_error", "model: not found"),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of requests has exceeded your rate limit."),
    500: ("api_error", "Internal server error"),
    503: ("overloaded_error", "Overloaded"),
    504: ("timeout_error", "Request timed out"),
    529: ("overloaded_error", "Overloaded"),
}


def _openai_error(status: int, message: str | None) -> dict[str, Any]:
    default = _OPENAI_ERRORS[400 if status < 500 else 500]
    kind, code, text = _OPENAI_ERRORS.get(status, default)
    return {"error": {"message": message or text, "type": kind, "param": None, "code": code}}


def _anthropic_error(status: int, message: str | None, request_id: str) -> dict[str, Any]:
    default = _ANTHROPIC_ERRORS[400 if status < 500 else 500]
    kind, text = _ANTHROPIC_ERRORS.get(status, default)
    return {
        "type": "error",
        "error": {"type": kind, "message": message or text},
        "request_id": request_id,
    }


def error_reply(dialect: str, status: int, request_id: str, message: str | None = None) -> Reply:
    """``status`` with the dialect's error body (``message`` replaces the default text)."""
    body = (
        _anthropic_error(status, message, request_id)
        if dialect == "messages"
        else _openai_error(status, message)
    )
    return Reply(
        ReplyKind.BODY,
        status=status,
        headers=_headers(dialect, request_id, _JSON),
        body=orjson.dumps(body),
    )


def is_authorized(dialect: str, headers: Mapping[str, str], api_key: str) -> bool:
    """OpenAI routes take ``authorization: Bearer <key>``; Anthropic also ``x-api-key: <key>``."""
    offered: list[str] = []
    authorization = headers.get("authorization")
    if authorization is not None:
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() == "bearer":
            offered.append(token.strip())
    if dialect == "messages" and (x_api_key := headers.get("x-api-key")) is not None:
        offered.append(x_api_key.strip())
    expected = api_key.encode()
    return any(hmac.compare_digest(token.encode(), expected) for token in offered)


def models_list() -> dict[str, Any]:
    """``GET /v1/models``: the default model and one model per named scenario."""
    return {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": 1_700_000_000, "owned_by": "rollcap"}
            for name in (DEFAULT_MODEL, *SCENARIOS)
        ],
    }


# --- dialect renderers ---------------------------------------------------------------------------

# One SSE frame before encoding: the event name and its data (an object, or raw text).
Frame = tuple[str | None, dict[str, Any] | str]


class _Renderer:
    """A dialect's shapes: the final object, the complete stream, and its mid-stream error."""

    def final(self, plan: Plan, body: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def frames(self, plan: Plan, body: Mapping[str, Any]) -> list[Frame]:
        raise NotImplementedError

    def error_frames(self) -> list[Frame]:
        raise NotImplementedError

    def encode(self, frames: Sequence[Frame]) -> tuple[bytes, ...]:
        return tuple(_encode(name, data) for name, data in frames)


def _encode(name: str | None, data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else orjson.dumps(data).decode()
    return encode_event(SSEEvent(data=text, event=name))


class _Responses(_Renderer):
    def _response(
        self,
        plan: Plan,
        body: Mapping[str, Any],
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None,
    ) -> dict[str, Any]:
        reasoning = as_dict(body.get("reasoning"))
        tools = body.get("tools")
        temperature = body.get("temperature")
        max_output_tokens = body.get("max_output_tokens")
        return {
            "id": f"resp_{plan.ident('response', 48)}",
            "object": "response",
            "created_at": plan.created,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "instructions": as_str(body.get("instructions")),
            "max_output_tokens": max_output_tokens if isinstance(max_output_tokens, int) else None,
            "max_tool_calls": None,
            "model": plan.model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": as_str(body.get("previous_response_id")),
            "prompt_cache_key": None,
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "safety_identifier": None,
            "service_tier": "default",
            "store": True,
            "temperature": temperature if isinstance(temperature, int | float) else 1.0,
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": "auto",
            "tools": tools if isinstance(tools, list) else [],
            "top_logprobs": 0,
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            "metadata": {},
        }

    def _usage(self, plan: Plan) -> dict[str, Any]:
        u = plan.usage
        return {
            "input_tokens": u.input_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.output_tokens,
            "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            "total_tokens": u.total_tokens,
        }

    def _items(self, plan: Plan) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
        """Each output item, final, with the events that stream it (``output_index`` set)."""
        items: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
        if plan.reasoning is not None:
            items.append(self._reasoning_item(plan, plan.reasoning, len(items)))
        if plan.tool is not None:
            items.append(self._function_call_item(plan, plan.tool, len(items)))
        if plan.text is not None:
            items.append(self._message_item(plan, plan.text, len(items)))
        return items

    def _reasoning_item(
        self, plan: Plan, reasoning: str, index: int
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        item_id = f"rs_{plan.ident('reasoning', 48)}"
        final = {
            "id": item_id,
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": reasoning}],
        }
        at = {"item_id": item_id, "output_index": index, "summary_index": 0}
        events = [
            _typed(
                "response.output_item.added",
                output_index=index,
                item={"id": item_id, "type": "reasoning", "summary": []},
            ),
            _typed(
                "response.reasoning_summary_part.added",
                **at,
                part={"type": "summary_text", "text": ""},
            ),
            *(
                _typed("response.reasoning_summary_text.delta", **at, delta=piece)
                for piece in plan.reasoning_pieces
            ),
            _typed("response.reasoning_summary_text.done", **at, text=reasoning),
            _typed(
                "response.reasoning_summary_part.done",
                **at,
                part={"type": "summary_text", "text": reasoning},
            ),
            _typed("response.output_item.done", output_index=index, item=final),
        ]
        return final, events

    def _function_call_item(
        self, plan: Plan, tool: ToolPlan, index: int
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        item_id = f"fc_{plan.ident('function_call', 48)}"
        call_id = f"call_{plan.ident('call', 24)}"

        def item(status: str, arguments: str) -> dict[str, Any]:
            return {
                "id": item_id,
                "type": "function_call",
                "status": status,
                "arguments": arguments,
                "call_id": call_id,
                "name": tool.name,
            }

        final = item("completed", tool.arguments)
        at = {"item_id": item_id, "output_index": index}
        events = [
            _typed("response.output_item.added", output_index=index, item=item("in_progress", "")),
            *(
                _typed("response.function_call_arguments.delta", **at, delta=piece)
                for piece in tool.pieces
            ),
            _typed("response.function_call_arguments.done", **at, arguments=tool.arguments),
            _typed("response.output_item.done", output_index=index, item=final),
        ]
        return final, events

    def _message_item(
        self, plan: Plan, text: str, index: int
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        item_id = f"msg_{plan.ident('message', 48)}"
        status = "incomplete" if plan.finish is Finish.LENGTH else "completed"

        def part(value: str) -> dict[str, Any]:
            return {"type": "output_text", "annotations": [], "logprobs": [], "text": value}

        final = {
            "id": item_id,
            "type": "message",
            "status": status,
            "content": [part(text)],
            "role": "assistant",
        }
        at = {"item_id": item_id, "output_index": index, "content_index": 0}
        events = [
            _typed(
                "response.output_item.added",
                output_index=index,
                item={
                    "id": item_id,
                    "type": "message",
                    "status": "in_progress",
                    "content": [],
                    "role": "assistant",
                },
            ),
            _typed("response.content_part.added", **at, part=part("")),
            *(
                _typed("response.output_text.delta", **at, delta=piece, logprobs=[])
                for piece in plan.text_pieces
            ),
            _typed("response.output_text.done", **at, text=text, logprobs=[]),
            _typed("response.content_part.done", **at, part=part(text)),
            _typed("response.output_item.done", output_index=index, item=final),
        ]
        return final, events

    def final(self, plan: Plan, body: Mapping[str, Any]) -> dict[str, Any]:
        status = "incomplete" if plan.finish is Finish.LENGTH else "completed"
        output = [final for final, _ in self._items(plan)]
        return self._response(plan, body, status, output, self._usage(plan))

    def frames(self, plan: Plan, body: Mapping[str, Any]) -> list[Frame]:
        started = self._response(plan, body, "in_progress", [], None)
        payloads = [
            _typed("response.created", response=started),
            _typed("response.in_progress", response=started),
        ]
        for _, events in self._items(plan):
            payloads.extend(events)
        final = self.final(plan, body)
        terminal = (
            "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        )
        payloads.append(_typed(terminal, response=final))
        return [(payload["type"], payload) for payload in payloads]

    def error_frames(self) -> list[Frame]:
        return [
            (
                "error",
                _typed(
                    "error",
                    code="server_error",
                    message="The server had an error while processing your request.",
                    param=None,
                ),
            )
        ]

    def encode(self, frames: Sequence[Frame]) -> tuple[bytes, ...]:
        # Sequence numbers count the frames actually sent, in order; a raw (non-JSON) frame
        # carries none.
        numbered: list[Frame] = []
        number = 0
        for name, data in frames:
            if isinstance(data, dict):
                data = {**data, "sequence_number": number}
                number += 1
            numbered.append((name, data))
        return super().encode(numbered)


def _typed(kind: str, **fields: Any) -> dict[str, Any]:
    # ``sequence_number`` right after ``type``, as the API orders them; set when encoding.
    return {"type": kind, "sequence_number": 0, **fields}


_CHAT_FINISH = {Finish.STOP: "stop", Finish.TOOL: "tool_calls", Finish.LENGTH: "length"}


class _Chat(_Renderer):
    def _top(self, plan: Plan) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{plan.ident('chat', 32)}",
            "created": plan.created,
            "model": plan.model,
        }

    def _extras(self, plan: Plan) -> dict[str, Any]:
        return {"service_tier": "default", "system_fingerprint": f"fp_{plan.ident('fp', 10)}"}

    def _usage(self, plan: Plan) -> dict[str, Any]:
        u = plan.usage
        return {
            "prompt_tokens": u.input_tokens,
            "completion_tokens": u.output_tokens,
            "total_tokens": u.total_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": u.reasoning_tokens,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def _call_id(self, plan: Plan) -> str:
        return f"call_{plan.ident('call', 24)}"

    def _logprobs(
        self, body: Mapping[str, Any], ids: Sequence[int], start: int
    ) -> dict[str, Any] | None:
        """The ``logprobs`` of a choice carrying generated ``ids`` from position ``start``."""
        if body.get("logprobs") is not True or not ids:
            return None
        as_token_ids = body.get("return_tokens_as_token_ids") is True
        return {"content": tokenizer.logprob_entries(ids, start=start, as_token_ids=as_token_ids)}

    def final(self, plan: Plan, body: Mapping[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": plan.text, "refusal": None}
        if plan.reasoning is not None:
            message["reasoning_content"] = plan.reasoning
        if plan.tool is not None:
            message["tool_calls"] = [
                {
                    "id": self._call_id(plan),
                    "type": "function",
                    "function": {"name": plan.tool.name, "arguments": plan.tool.arguments},
                }
            ]
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": _CHAT_FINISH[plan.finish],
        }
        tokens: dict[str, Any] = {}
        if plan.tokens is not None:
            choice["logprobs"] = self._logprobs(body, plan.tokens.generated, 0)
            choice["token_ids"] = list(plan.tokens.generated)
            tokens["prompt_token_ids"] = list(plan.tokens.prompt)
        return {
            **self._top(plan),
            "object": "chat.completion",
            "choices": [choice],
            "usage": self._usage(plan),
            **self._extras(plan),
            **tokens,
        }

    def _chunk_ids(self, plan: Plan) -> list[list[int]]:
        """The generated ids each chunk of the stream carries, in the order of ``frames``."""
        ids: list[list[int]] = [[]]  # the first chunk: the role (and the tool call's name)
        ids.extend([] for _ in plan.reasoning_pieces)
        ids.extend(tokenizer.encode(piece) for piece in plan.text_pieces)
        finish = [tokenizer.END_ID]
        if plan.tool is not None and plan.tool.pieces:
            # The call's text around its arguments goes with the first and last argument pieces.
            head, tail = tokenizer.tool_call_parts(plan.tool.name)
            pieces = [tokenizer.encode(piece) for piece in plan.tool.pieces]
            pieces[0][:0] = tokenizer.encode(head)
            pieces[-1].extend(tokenizer.encode(tail))
            ids.extend(pieces)
        elif plan.tool is not None:  # no argument deltas: the whole call goes with the finish
            finish[:0] = tokenizer.encode(
                tokenizer.tool_call_text(plan.tool.name, plan.tool.arguments)
            )
        ids.append(finish)
        return ids

    def frames(self, plan: Plan, body: Mapping[str, Any]) -> list[Frame]:
        include_usage = wants_stream_usage(body)
        top = {**self._top(plan), "object": "chat.completion.chunk", **self._extras(plan)}
        # With token ids: each chunk's share of the generated ids, the prompt on the first chunk.
        chunk_ids = iter(self._chunk_ids(plan)) if plan.tokens is not None else None
        position, opening = 0, True

        def chunk(delta: dict[str, Any], finish: str | None = None) -> Frame:
            nonlocal position, opening
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
            }
            data: dict[str, Any] = {**top, "choices": [choice]}
            if include_usage:
                data["usage"] = None
            if plan.tokens is not None and chunk_ids is not None:
                ids = next(chunk_ids)
                choice["logprobs"] = self._logprobs(body, ids, position)
                choice["token_ids"] = ids
                if opening:
                    data["prompt_token_ids"] = list(plan.tokens.prompt)
                position += len(ids)
            opening = False
            return (None, data)

        first: dict[str, Any] = {"role": "assistant", "content": "", "refusal": None}
        if plan.tool is not None:
            first["content"] = None
            first["tool_calls"] = [
                {
                    "index": 0,
                    "id": self._call_id(plan),
                    "type": "function",
                    "function": {"name": plan.tool.name, "arguments": ""},
                }
            ]
        frames = [chunk(first)]
        frames.extend(chunk({"reasoning_content": piece}) for piece in plan.reasoning_pieces)
        frames.extend(chunk({"content": piece}) for piece in plan.text_pieces)
        if plan.tool is not None:
            frames.extend(
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
                for piece in plan.tool.pieces
            )
        frames.append(chunk({}, _CHAT_FINISH[plan.finish]))
        if include_usage:
            frames.append((None, {**top, "choices": [], "usage": self._usage(plan)}))
        frames.append((None, "[DONE]"))
        return frames

    def error_frames(self) -> list[Frame]:
        error = {
            "message": "The server had an error while processing your request.",
            "type": "server_error",
            "param": None,
            "code": "server_error",
        }
        return [(None, {"error": error}), (None, "[DONE]")]


_MESSAGES_STOP = {Finish.STOP: "end_turn", Finish.TOOL: "tool_use", Finish.LENGTH: "max_tokens"}


class _Messages(_Renderer):
    def _usage(self, plan: Plan, output_tokens: int) -> dict[str, Any]:
        u = plan.usage
        return {
            "input_tokens": u.input_tokens - u.cached_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": u.cached_tokens,
            "output_tokens": output_tokens,
            "service_tier": "standard",
        }

    def _message(
        self, plan: Plan, content: list[dict[str, Any]], stop_reason: str | None, output: int
    ) -> dict[str, Any]:
        return {
            "id": f"msg_01{plan.ident('message', 22)}",
            "type": "message",
            "role": "assistant",
            "model": plan.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": self._usage(plan, output),
        }

    def _signature(self, plan: Plan) -> str:
        raw = bytes.fromhex(plan.ident("signature", 96))
        return base64.b64encode(raw).decode()

    def _blocks(self, plan: Plan) -> list[tuple[dict[str, Any], dict[str, Any], list[Any]]]:
        """Each content block: final, as started, and its deltas."""
        blocks: list[tuple[dict[str, Any], dict[str, Any], list[Any]]] = []
        if plan.reasoning is not None:
            signature = self._signature(plan)
            blocks.append(
                (
                    {"type": "thinking", "thinking": plan.reasoning, "signature": signature},
                    {"type": "thinking", "thinking": "", "signature": ""},
                    [
                        *({"type": "thinking_delta", "thinking": p} for p in plan.reasoning_pieces),
                        {"type": "signature_delta", "signature": signature},
                    ],
                )
            )
        if plan.text is not None:
            blocks.append(
                (
                    {"type": "text", "text": plan.text},
                    {"type": "text", "text": ""},
                    [{"type": "text_delta", "text": p} for p in plan.text_pieces],
                )
            )
        if plan.tool is not None:
            tool_id = f"toolu_01{plan.ident('tool_use', 22)}"
            tool = {"type": "tool_use", "id": tool_id, "name": plan.tool.name}
            blocks.append(
                (
                    {**tool, "input": orjson.loads(plan.tool.arguments)},
                    {**tool, "input": {}},
                    [
                        {"type": "input_json_delta", "partial_json": p}
                        for p in ("", *plan.tool.pieces)
                    ],
                )
            )
        return blocks

    def final(self, plan: Plan, body: Mapping[str, Any]) -> dict[str, Any]:
        content = [final for final, _, _ in self._blocks(plan)]
        return self._message(plan, content, _MESSAGES_STOP[plan.finish], plan.usage.output_tokens)

    def frames(self, plan: Plan, body: Mapping[str, Any]) -> list[Frame]:
        def event(kind: str, **fields: Any) -> Frame:
            return (kind, {"type": kind, **fields})

        frames = [event("message_start", message=self._message(plan, [], None, 1))]
        for index, (_, start, deltas) in enumerate(self._blocks(plan)):
            frames.append(event("content_block_start", index=index, content_block=start))
            if index == 0:
                frames.append(event("ping"))
            frames.extend(event("content_block_delta", index=index, delta=d) for d in deltas)
            frames.append(event("content_block_stop", index=index))
        usage = self._usage(plan, plan.usage.output_tokens)
        del usage["service_tier"]
        frames.append(
            event(
                "message_delta",
                delta={"stop_reason": _MESSAGES_STOP[plan.finish], "stop_sequence": None},
                usage=usage,
            )
        )
        frames.append(event("message_stop"))
        return frames

    def error_frames(self) -> list[Frame]:
        error = {"type": "overloaded_error", "message": "Overloaded"}
        return [("error", {"type": "error", "error": error})]


_RENDERERS: dict[str, _Renderer] = {
    "responses": _Responses(),
    "chat": _Chat(),
    "messages": _Messages(),
}


def _malformed(frames: Sequence[Frame], at: int) -> Frame:
    name = frames[at][0] if at < len(frames) else None
    return (name, '{"type": "%s", "note": "this data line is not JSON"' % (name or "chunk"))


def _scenario_reply(dialect: str, body: Mapping[str, Any], knobs: Knobs, request_id: str) -> Reply:
    scenario = knobs.scenario
    if scenario == "hang":
        return Reply(ReplyKind.HANG)
    if scenario == "disconnect":
        return Reply(ReplyKind.DISCONNECT)
    status = _http_status(scenario)
    if status is not None:
        return error_reply(dialect, status, request_id)
    renderer = _RENDERERS[dialect]
    try:
        plan = plan_answer(dialect, body, knobs)
    except KnobError as exc:
        return error_reply(dialect, 400, request_id, str(exc))
    if body.get("stream") is not True:
        if scenario == "stream_error":
            # Without a stream, failing mid-generation is an error status.
            return error_reply(dialect, 529 if dialect == "messages" else 500, request_id)
        data = orjson.dumps(renderer.final(plan, body))
        headers = _headers(dialect, request_id, _JSON)
        if scenario == "malformed_json":
            return Reply(ReplyKind.BODY, headers=headers, body=data[: len(data) // 2])
        if scenario == "truncate":
            return Reply(
                ReplyKind.BODY,
                headers=headers,
                body=data[: len(data) // 2],
                declared_length=len(data),
                cut=True,
            )
        return Reply(ReplyKind.BODY, headers=headers, body=data)
    frames = renderer.frames(plan, body)
    middle = len(frames) // 2
    cut = False
    if scenario == "truncate":
        frames, cut = frames[:middle], True
    elif scenario == "stream_error":
        frames = frames[:middle] + renderer.error_frames()
    elif scenario == "malformed_json":
        frames.insert(middle, _malformed(frames, middle))
    return Reply(
        ReplyKind.STREAM,
        headers=_headers(dialect, request_id, _SSE),
        events=renderer.encode(frames),
        cut=cut,
    )


def answer(
    dialect: str,
    raw_body: bytes,
    headers: Mapping[str, str],
    *,
    request_id: str,
    api_key: str | None = None,
) -> Reply:
    """The reply to one request on a dialect's route.

    Checked in order: the API key (401), a JSON object body (400), the knobs (400); then the
    scenario decides. ``headers`` is case-insensitive or has lower-case names.
    """
    if dialect not in _RENDERERS:
        raise ValueError(f"unknown dialect {dialect!r}: expected one of {', '.join(DIALECTS)}")
    if api_key is not None and not is_authorized(dialect, headers, api_key):
        return error_reply(dialect, 401, request_id)
    try:
        body = orjson.loads(raw_body)
    except orjson.JSONDecodeError:
        return error_reply(
            dialect, 400, request_id, "We could not parse the JSON body of your request."
        )
    if not isinstance(body, dict):
        return error_reply(dialect, 400, request_id, "The request body must be a JSON object.")
    try:
        knobs = read_knobs(headers, body)
    except KnobError as exc:
        return error_reply(dialect, 400, request_id, str(exc))
    reply = _scenario_reply(dialect, body, knobs, request_id)
    return replace(reply, delay_s=knobs.delay_s, chunk_delay_s=knobs.chunk_delay_s)


def expected_response(
    dialect: str, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The object a completing scenario answers ``body`` with, non-streamed (``stream`` ignored).

    It is also what reassembling the streamed answer gives (for chat, with usage requested).
    Raises ``ValueError`` when the request would not get a complete JSON answer.
    """
    request = {k: v for k, v in body.items() if k != "stream"}
    reply = answer(dialect, orjson.dumps(request), headers or {}, request_id="req_expected")
    if reply.kind is not ReplyKind.BODY or reply.status != 200 or reply.cut:
        raise ValueError("this request gets no complete JSON answer")
    try:
        value = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        raise ValueError("this request gets a body that is not JSON") from None
    if not isinstance(value, dict):  # pragma: no cover - every renderer builds an object
        raise ValueError("this request gets no JSON object")
    return value
