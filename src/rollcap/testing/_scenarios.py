"""What the fake upstream answers, built without any I/O (pure).

``answer(dialect, raw_body, headers, request_id=..., api_key=...)`` turns one request into a
``Reply``: a status, headers, and either a body or the encoded SSE frames of a stream, plus what the
shell must do besides sending them (wait first, pause between frames, cut the connection, hang,
drop it). The shell in ``_server`` only carries a ``Reply`` out.

The way there: the knobs (``_knobs``: the scenario and the ``x-fake-*`` headers), the answer
before any dialect (``_plan``), then the dialect's renderer (``_render_<dialect>``). The
scenarios are described for users in the package docstring.

A non-streamed answer is exactly what ``rollcap.dialects.reassemble`` rebuilds from the streamed
answer to the same request (for chat, when the stream asked for usage with
``stream_options.include_usage``). With token ids, ``reassemble`` rebuilds neither
``prompt_token_ids`` nor ``token_ids`` from a stream and adds ``"refusal": null`` to the
logprobs; apart from that the equality holds for such a request too.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from rollcap.testing._knobs import (
    DEFAULT_MODEL,
    DIALECTS,
    SCENARIOS,
    KnobError,
    Knobs,
    http_status,
    read_knobs,
)
from rollcap.testing._plan import Plan, plan_answer
from rollcap.testing._render import Frame, Renderer
from rollcap.testing._render_chat import ChatRenderer
from rollcap.testing._render_messages import MessagesRenderer
from rollcap.testing._render_responses import ResponsesRenderer

__all__ = [
    "Reply",
    "ReplyKind",
    "answer",
    "error_reply",
    "expected_response",
    "is_authorized",
    "models_list",
]


class ReplyKind(enum.Enum):
    BODY = "body"  # a status and a body
    STREAM = "stream"  # a 200 and SSE frames
    HANG = "hang"  # never answer, until the client leaves or the server stops
    DISCONNECT = "disconnect"  # close the connection without answering


Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Reply:
    """What to send. ``cut``: close the connection after ``body`` / ``events`` without finishing
    the response; a cut body announces ``declared_length`` bytes and sends fewer. ``repeat``:
    after ``events``, send these bytes again and again until the client leaves."""

    kind: ReplyKind
    status: int = 200
    headers: Headers = ()
    body: bytes = b""
    events: tuple[bytes, ...] = ()
    declared_length: int | None = None
    cut: bool = False
    delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    repeat: bytes = b""


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


# The context the fake pretends its model has, for the context_length scenario.
_FAKE_CONTEXT_TOKENS = 4096


def context_length_reply(dialect: str, body: Mapping[str, Any], request_id: str) -> Reply:
    """A 400 saying the prompt exceeds the model's context, as each API words it: OpenAI's
    ``context_length_exceeded`` error (the chat routes, as vLLM's OpenAI server words it too)
    and Anthropic's ``prompt is too long``."""
    asked = _FAKE_CONTEXT_TOKENS + 1 + len(orjson.dumps(body)) // 4
    if dialect == "messages":
        message = f"prompt is too long: {asked} tokens > {_FAKE_CONTEXT_TOKENS} maximum"
        return error_reply(dialect, 400, request_id, message)
    message = (
        f"This model's maximum context length is {_FAKE_CONTEXT_TOKENS} tokens. However, your "
        f"messages resulted in {asked} tokens. Please reduce the length of the messages."
    )
    error = {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    return Reply(
        ReplyKind.BODY,
        status=400,
        headers=_headers(dialect, request_id, _JSON),
        body=orjson.dumps(error),
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


_RENDERERS: dict[str, Renderer] = {
    "responses": ResponsesRenderer(),
    "chat": ChatRenderer(),
    "messages": MessagesRenderer(),
}


def _malformed(frames: Sequence[Frame], at: int) -> Frame:
    name = frames[at][0] if at < len(frames) else None
    return (name, '{"type": "%s", "note": "this data line is not JSON"' % (name or "chunk"))


# An endless stream repeats its text delta in writes of at least this many bytes.
_ENDLESS_WRITE = 16 * 1024


def _endless(renderer: Renderer, plan: Plan, body: Mapping[str, Any]) -> tuple[list[Frame], Frame]:
    """The frames of a stream up to its first text delta, and that delta (to repeat).

    Found without knowing the dialect: the stream of the answer's text said twice has one more
    frame than the stream of it said once, and the first frame they differ at is the repeat.
    """
    text = plan.text or "word "
    once = renderer.frames(replace(plan, text=text, text_pieces=(text,)), body)
    twice = renderer.frames(replace(plan, text=text * 2, text_pieces=(text, text)), body)
    at = next(i for i, (a, b) in enumerate(zip(once, twice, strict=False)) if a != b)
    return twice[:at], twice[at]


def _scenario_reply(dialect: str, body: Mapping[str, Any], knobs: Knobs, request_id: str) -> Reply:
    scenario = knobs.scenario
    if scenario == "hang":
        return Reply(ReplyKind.HANG)
    if scenario == "disconnect":
        return Reply(ReplyKind.DISCONNECT)
    status = http_status(scenario)
    if status is not None:
        return error_reply(dialect, status, request_id)
    if scenario == "context_length":
        return context_length_reply(dialect, body, request_id)
    renderer = _RENDERERS[dialect]
    try:
        plan = plan_answer(dialect, body, knobs)
    except KnobError as exc:
        return error_reply(dialect, 400, request_id, str(exc))
    if scenario == "endless":
        if body.get("stream") is not True:
            return error_reply(dialect, 400, request_id, "the endless scenario is a stream")
        head, delta = _endless(renderer, plan, body)
        encoded = renderer.encode([*head, delta])
        return Reply(
            ReplyKind.STREAM,
            headers=_headers(dialect, request_id, _SSE),
            events=encoded[:-1],
            repeat=encoded[-1] * max(1, _ENDLESS_WRITE // len(encoded[-1])),
        )
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

    It is also what reassembling the streamed answer gives (for chat, with usage requested, and
    with each tool call's ``index``, which only the stream's fragments carry).
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
