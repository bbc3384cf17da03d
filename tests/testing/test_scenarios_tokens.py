"""Token ids on the chat route, built without a server: shapes, streams, usage, refusals."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from rollcap.dialects import reassemble
from rollcap.sse import SSEDecoder
from rollcap.testing import (
    PREFIX_IDS_FIELD,
    assistant_body,
    decode,
    encode,
    expected_response,
    fake_logprob,
    render_prompt,
)
from rollcap.testing._scenarios import Reply, ReplyKind, answer
from tests.testing._support import with_stream_index

PROMPT = "What is the capital of France? Answer in one short sentence, please."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
TOKENS = {"return_token_ids": True, "logprobs": True}
COMPLETING = ("text", "tool", "reasoning", "incomplete")


def chat(**extra: Any) -> dict[str, Any]:
    return {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": PROMPT}],
        "tools": TOOLS,
        **extra,
    }


def reply(body: dict[str, Any], scenario: str = "text") -> Reply:
    return answer("chat", orjson.dumps(body), {"x-fake-scenario": scenario}, request_id="req_test")


def chunks(r: Reply) -> list[Any]:
    assert r.kind is ReplyKind.STREAM
    decoder = SSEDecoder()
    events = [e for frame in r.events for e in decoder.feed(frame)] + decoder.flush()
    return [orjson.loads(e.data) for e in events if e.data != "[DONE]"]


def without_ids(value: Any) -> Any:
    """``value`` without the fields that depend on the request's hash."""
    if isinstance(value, dict):
        return {
            k: without_ids(v)
            for k, v in value.items()
            if k not in ("id", "created", "system_fingerprint")
        }
    if isinstance(value, list):
        return [without_ids(v) for v in value]
    return value


@pytest.mark.parametrize("scenario", COMPLETING)
def test_token_fields_of_a_non_streamed_answer(scenario: str) -> None:
    body = chat(**TOKENS)
    response = expected_response("chat", body, {"x-fake-scenario": scenario})
    choice = response["choices"][0]
    message = choice["message"]

    assert response["prompt_token_ids"] == render_prompt(body["messages"])
    generated = choice["token_ids"]
    assert generated == [*encode(assistant_body(message)), 2]
    assert decode(generated) == assistant_body(message)
    if scenario != "tool":
        assert decode(generated) == message["content"]
    entries = choice["logprobs"]["content"]
    assert [e["logprob"] for e in entries] == [fake_logprob(t, i) for i, t in enumerate(generated)]
    assert [e["token"] for e in entries[:-1]] == list(decode(generated[:-1]))  # ASCII answers
    assert entries[-1]["token"] == "<|end|>"
    assert all(e["top_logprobs"] == [] for e in entries)
    assert set(entries[0]) == {"token", "logprob", "bytes", "top_logprobs"}
    usage = response["usage"]
    assert usage["prompt_tokens"] == len(response["prompt_token_ids"])
    assert usage["completion_tokens"] == len(generated)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] // 2
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 0


@pytest.mark.parametrize("scenario", COMPLETING)
def test_the_answer_itself_is_the_same_with_token_ids(scenario: str) -> None:
    plain = expected_response("chat", chat(), {"x-fake-scenario": scenario})
    tokens = expected_response("chat", chat(**TOKENS), {"x-fake-scenario": scenario})
    del tokens["prompt_token_ids"], tokens["choices"][0]["token_ids"]
    tokens["choices"][0]["logprobs"] = None
    del tokens["usage"], plain["usage"]
    assert without_ids(tokens) == without_ids(plain)


def test_tool_call_ids_spell_the_call() -> None:
    response = expected_response("chat", chat(**TOKENS), {"x-fake-scenario": "tool"})
    (call,) = response["choices"][0]["message"]["tool_calls"]
    assert response["choices"][0]["message"]["content"] is None
    assert decode(response["choices"][0]["token_ids"]) == (
        f"<tool_call>get_weather\n{call['function']['arguments']}</tool_call>"
    )


def test_tokens_as_token_ids() -> None:
    response = expected_response("chat", chat(**TOKENS, return_tokens_as_token_ids=True))
    choice = response["choices"][0]
    entries = choice["logprobs"]["content"]
    assert [e["token"] for e in entries] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert entries[0]["bytes"] == [choice["token_ids"][0] - 3]


def test_token_ids_without_logprobs() -> None:
    response = expected_response("chat", chat(return_token_ids=True))
    assert response["choices"][0]["logprobs"] is None
    assert response["choices"][0]["token_ids"][-1] == 2
    assert response["prompt_token_ids"][-1] == 13


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"logprobs": True},
        {"logprobs": True, "top_logprobs": 3, "return_tokens_as_token_ids": True},
        {"return_token_ids": False, "logprobs": True},
        {"return_token_ids": None},
        {PREFIX_IDS_FIELD: [1, 2, 3]},
    ],
)
@pytest.mark.parametrize("scenario", COMPLETING)
def test_no_token_fields_without_return_token_ids(extra: dict[str, Any], scenario: str) -> None:
    response = expected_response("chat", chat(**extra), {"x-fake-scenario": scenario})
    assert "prompt_token_ids" not in response
    assert set(response["choices"][0]) == {"index", "message", "logprobs", "finish_reason"}
    assert response["choices"][0]["logprobs"] is None
    # Usage still counts characters: the 68-character prompt is 17 tokens.
    assert response["usage"]["prompt_tokens"] == 17
    plain = expected_response("chat", chat(), {"x-fake-scenario": scenario})
    assert without_ids(response) == without_ids(plain)
    stream = chunks(reply(chat(**extra, stream=True), scenario))
    assert all("prompt_token_ids" not in c for c in stream)
    assert all(
        set(c["choices"][0]) == {"index", "delta", "logprobs", "finish_reason"}
        and c["choices"][0]["logprobs"] is None
        for c in stream
    )


@pytest.mark.parametrize("events", [None, "0", "1", "5"])
@pytest.mark.parametrize("scenario", COMPLETING)
def test_stream_chunks_carry_the_same_ids(scenario: str, events: str | None) -> None:
    headers = {"x-fake-scenario": scenario} | ({"x-fake-events": events} if events else {})
    body = chat(**TOKENS, stream_options={"include_usage": True})
    whole = expected_response("chat", body, headers)
    r = answer("chat", orjson.dumps({**body, "stream": True}), headers, request_id="req_test")
    stream = chunks(r)
    choices = [c["choices"][0] for c in stream if c["choices"]]

    assert stream[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in stream[1:])
    assert all("token_ids" in choice for choice in choices)
    ids = [t for choice in choices for t in choice["token_ids"]]
    assert ids == whole["choices"][0]["token_ids"]
    entries = [e for choice in choices if choice["logprobs"] for e in choice["logprobs"]["content"]]
    assert entries == whole["choices"][0]["logprobs"]["content"]
    # Each chunk's ids spell what its delta adds.
    for choice in choices:
        delta = choice["delta"]
        pieces = [delta.get("content") or ""]
        pieces += [c["function"]["arguments"] for c in delta.get("tool_calls", [])]
        assert "".join(pieces) in decode(choice["token_ids"])
    assert stream[-1]["usage"] == whole["usage"]

    # The stream reassembles to the non-streamed answer, token fields included.
    rebuilt = reassemble("chat", r.events).response
    assert rebuilt is not None
    expected = with_stream_index(whole)
    expected["choices"][0]["logprobs"] = {**expected["choices"][0]["logprobs"], "refusal": None}
    if events == "0" and scenario == "tool":
        # With no argument deltas the stream carries no arguments (as without token ids).
        expected["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = ""
    assert rebuilt == expected


def test_pinned_prefix() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "sunny"},
    ]
    pinned = [1, 2, 3, 250, 258, 1000]
    body = {"model": "m", "messages": messages, "return_token_ids": True, PREFIX_IDS_FIELD: pinned}
    response = expected_response("chat", body)
    assert response["prompt_token_ids"] == [*pinned, *render_prompt(messages[2:])]
    assert response["usage"]["prompt_tokens"] == len(pinned) + len(render_prompt(messages[2:]))
    # null pins nothing.
    response = expected_response("chat", {**body, PREFIX_IDS_FIELD: None})
    assert response["prompt_token_ids"] == render_prompt(messages)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({PREFIX_IDS_FIELD: "1,2"}, PREFIX_IDS_FIELD),
        ({PREFIX_IDS_FIELD: [1, -2]}, PREFIX_IDS_FIELD),
        ({PREFIX_IDS_FIELD: [1, True]}, PREFIX_IDS_FIELD),
        ({PREFIX_IDS_FIELD: [1.0]}, PREFIX_IDS_FIELD),
        ({"messages": "hello"}, "messages must be a list"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "image_url"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_requests_that_cannot_be_tokenized_get_400(
    extra: dict[str, Any], match: str, stream: bool
) -> None:
    r = reply(chat(**TOKENS, **extra, stream=stream))
    assert r.status == 400
    error = orjson.loads(r.body)["error"]
    assert error["type"] == "invalid_request_error"
    assert match in error["message"]
    # Without token ids the fake answers the same request as it always has.
    assert reply(chat(**extra, stream=stream)).status == 200


def test_error_scenarios_are_unchanged_with_token_ids() -> None:
    assert reply(chat(**TOKENS), "http_429").status == 429
    assert reply(chat(**TOKENS, stream=True), "stream_error").kind is ReplyKind.STREAM
    assert reply(chat(**TOKENS), "stream_error").status == 500
