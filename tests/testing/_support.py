"""Requests of every dialect for the fake's tests, and ways to read its replies."""

from __future__ import annotations

from typing import Any

import orjson

from rollcap.dialects import StreamOutcome
from rollcap.sse import SSEDecoder, SSEEvent
from rollcap.testing._knobs import DIALECTS
from rollcap.testing._scenarios import Reply, ReplyKind, answer

__all__ = [
    "COMPLETING",
    "DIALECTS",
    "PROMPT",
    "TERMINAL_OUTCOME",
    "decode",
    "header",
    "json_of",
    "reply",
    "request",
    "streamed",
    "with_stream_index",
]


PROMPT = "What is the capital of France? Answer in one short sentence, please."
COMPLETING = ("text", "tool", "tool_turns", "reasoning", "incomplete", "choice")
TERMINAL_OUTCOME = {
    ("responses", "incomplete"): StreamOutcome.INCOMPLETE,
}


def request(dialect: str, **extra: Any) -> dict[str, Any]:
    """A typical request body of the dialect, with a tool in the dialect's own shape."""
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
        },
        "required": ["city", "unit"],
    }
    if dialect == "responses":
        body: dict[str, Any] = {
            "model": "gpt-test",
            "input": PROMPT,
            "tools": [{"type": "function", "name": "get_weather", "parameters": schema}],
        }
    elif dialect == "chat":
        body = {
            "model": "gpt-test",
            "messages": [{"role": "user", "content": PROMPT}],
            "tools": [
                {"type": "function", "function": {"name": "get_weather", "parameters": schema}}
            ],
        }
    else:
        body = {
            "model": "claude-test",
            "max_tokens": 256,
            "messages": [{"role": "user", "content": PROMPT}],
            "tools": [{"name": "get_weather", "input_schema": schema}],
        }
    return {**body, **extra}


def reply(
    dialect: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    **kwargs: Any,
) -> Reply:
    return answer(dialect, orjson.dumps(body), headers or {}, request_id="req_test", **kwargs)


def streamed(dialect: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Reply:
    extra = {"stream_options": {"include_usage": True}} if dialect == "chat" else {}
    return reply(dialect, {**body, "stream": True, **extra}, headers)


def decode(events: tuple[bytes, ...]) -> list[SSEEvent]:
    decoder = SSEDecoder()
    out = [event for frame in events for event in decoder.feed(frame)]
    return out + decoder.flush()


def json_of(r: Reply) -> Any:
    assert r.kind is ReplyKind.BODY
    return orjson.loads(r.body)


def header(r: Reply, name: str) -> str | None:
    return dict(r.headers).get(name)


def with_stream_index(response: Any) -> Any:
    """A non-streamed chat answer as its reassembled stream gives it: each tool call carries
    the ``index`` its fragments did (the SDK's accumulation keeps it; a whole answer has none)."""
    if not isinstance(response, dict) or not isinstance(response.get("choices"), list):
        return response
    choices = []
    for choice in response["choices"]:
        message = dict(choice.get("message") or {})
        if isinstance(message.get("tool_calls"), list):
            message["tool_calls"] = [
                {"index": position, **call} for position, call in enumerate(message["tool_calls"])
            ]
        choices.append({**choice, "message": message})
    return {**response, "choices": choices}
