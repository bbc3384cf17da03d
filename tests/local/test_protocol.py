"""The embedded chat server's request rules and bodies (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from rollcap.local import DEFAULT_MAX_TOKENS, MAX_TOKENS_CAP, ChatRequestError, parse_chat_request
from rollcap.local._protocol import Completion, chunk_body, completion_body

USER = [{"role": "user", "content": "Hi"}]


def test_defaults_are_deterministic_and_small() -> None:
    call = parse_chat_request({"model": "anything", "messages": USER})
    assert call.sampling.temperature == 0.0
    assert call.sampling.seed == 0
    assert call.sampling.max_tokens == DEFAULT_MAX_TOKENS
    assert (call.stream, call.include_usage) == (False, False)


def test_request_values_are_honoured_and_max_tokens_capped() -> None:
    call = parse_chat_request(
        {
            "messages": USER,
            "temperature": 0.7,
            "seed": 5,
            "stop": "\n",
            "max_tokens": 10_000,
            "stream": True,
            "stream_options": {"include_usage": True},
            "repetition_penalty": 1.1,
        }
    )
    s = call.sampling
    assert (s.temperature, s.seed, s.stop, s.repeat_penalty) == (0.7, 5, ("\n",), 1.1)
    assert s.max_tokens == MAX_TOKENS_CAP
    assert (call.stream, call.include_usage) == (True, True)
    both = parse_chat_request({"messages": USER, "max_tokens": 50, "max_completion_tokens": 7})
    assert both.sampling.max_tokens == 7


def test_messages_become_plain_text_turns() -> None:
    call = parse_chat_request(
        {
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
            ],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "tool_choice": "auto",
        }
    )
    assert [dict(m) for m in call.messages] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "f({})"},
        {"role": "user", "content": "Tool result:\n42"},
    ]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": [1]}, "stop"),
        ({"messages": []}, "messages"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0].type",
        ),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ],
)
def test_what_cannot_be_served_is_refused(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(ChatRequestError) as info:
        parse_chat_request({"messages": USER, **extra})
    assert info.value.param == param


def test_bodies_have_openai_shapes() -> None:
    done = Completion("Hello", "stop", prompt_tokens=9, completion_tokens=2)
    body = completion_body(done, completion_id="chatcmpl-1", created=1, model="m")
    assert body["choices"][0]["message"]["content"] == "Hello"
    assert body["usage"] == {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
    top: dict[str, Any] = {"completion_id": "chatcmpl-1", "created": 1, "model": "m"}
    delta = chunk_body(**top, delta={"content": "He"}, include_usage=True)
    assert delta["object"] == "chat.completion.chunk"
    assert delta["usage"] is None
    assert "usage" not in chunk_body(**top, delta={"content": "He"})
    final = chunk_body(**top, usage=done)
    assert final["choices"] == []
    assert final["usage"]["total_tokens"] == 11
