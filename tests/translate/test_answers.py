"""Non-streamed translation of a chat answer into a Responses response and a Messages message."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rollcap.dialects import get_dialect
from rollcap.translate import (
    THINKING_SIGNATURE,
    chat_response_to_messages,
    chat_response_to_responses,
)
from tests.translate._support import NAMESPACED_REQUEST


def _chat(message: dict[str, Any], finish: str | None = "stop", **top: Any) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "Qwen/Qwen3-8B",
        "choices": [choice],
        **top,
    }


USAGE = {
    "prompt_tokens": 100,
    "completion_tokens": 40,
    "total_tokens": 140,
    "prompt_tokens_details": {"cached_tokens": 64},
    "completion_tokens_details": {"reasoning_tokens": 30},
}
TOOL_CALL = {
    "id": "chatcmpl-tool-1",
    "type": "function",
    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
}


def _responses(chat: dict[str, Any], request: dict[str, Any] | None = None) -> dict[str, Any]:
    return chat_response_to_responses(
        chat, request or {"model": "m", "input": "x"}, response_id="resp_abc", created_at=7
    )


def _messages(chat: dict[str, Any], request: dict[str, Any] | None = None) -> dict[str, Any]:
    return chat_response_to_messages(
        chat, request or {"max_tokens": 5, "messages": []}, message_id="msg_abc"
    )


def test_responses_full_object() -> None:
    request = {
        "model": "policy",
        "input": "x",
        "instructions": "Be brief.",
        "tools": [{"type": "function", "name": "weather", "parameters": {}}],
        "tool_choice": "auto",
        "temperature": 0.3,
        "max_output_tokens": 99,
        "metadata": {"k": "v"},
    }
    chat = _chat(
        {"content": "Looking.", "reasoning_content": "Need weather.", "tool_calls": [TOOL_CALL]},
        "tool_calls",
        usage=USAGE,
    )
    response = _responses(chat, request)
    assert response == {
        "id": "resp_abc",
        "object": "response",
        "created_at": 7,
        "status": "completed",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": "Be brief.",
        "max_output_tokens": 99,
        "model": "Qwen/Qwen3-8B",
        "output": [
            {
                "id": "rs_abc",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "Need weather."}],
            },
            {
                "id": "msg_abc",
                "type": "message",
                "status": "completed",
                "content": [
                    {"type": "output_text", "annotations": [], "logprobs": [], "text": "Looking."}
                ],
                "role": "assistant",
            },
            {
                "id": "fc_abc_0",
                "type": "function_call",
                "status": "completed",
                "arguments": '{"city": "Paris"}',
                "call_id": "chatcmpl-tool-1",
                "name": "weather",
            },
        ],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "temperature": 0.3,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [{"type": "function", "name": "weather", "parameters": {}}],
        "top_p": None,
        "truncation": "disabled",
        "usage": {
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 64},
            "output_tokens": 40,
            "output_tokens_details": {"reasoning_tokens": 30},
            "total_tokens": 140,
        },
        "user": None,
        "metadata": {"k": "v"},
    }
    normalized = get_dialect("responses").normalize(response)
    assert (normalized.usage.tokens_in, normalized.usage.cached_tokens) == (100, 64)
    assert normalized.reasoning_content == "Need weather."
    assert [call.to_dict() for call in normalized.tool_calls] == [
        {"call_id": "chatcmpl-tool-1", "name": "weather", "arguments": {"city": "Paris"}}
    ]


def _call(call_id: str, name: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def test_responses_namespaced_tool_calls() -> None:
    chat = _chat(
        {
            "content": None,
            "tool_calls": [
                _call("c1", "crm__lookup"),
                _call("c2", "weather"),
                _call("c3", "crm__missing"),
                _call("c4", "crm__update"),
            ],
        },
        "tool_calls",
    )
    response = _responses(chat, NAMESPACED_REQUEST)
    assert response["output"] == [
        {
            "id": f"fc_abc_{n}",
            "type": "function_call",
            "status": "completed",
            "arguments": "{}",
            "call_id": f"c{n + 1}",
            **names,
        }
        for n, names in enumerate(
            [
                {"name": "lookup", "namespace": "crm"},
                {"name": "weather"},
                {"name": "crm__missing"},
                {"name": "update", "namespace": "crm"},
            ]
        )
    ]
    # The echo is the request's tools as the client gave them, namespace and all.
    assert response["tools"] == NAMESPACED_REQUEST["tools"]
    # Without the request's namespaces the joined name is just a name.
    plain = _responses(chat)
    assert [item["name"] for item in plain["output"]] == [
        "crm__lookup",
        "weather",
        "crm__missing",
        "crm__update",
    ]
    assert all("namespace" not in item for item in plain["output"])


def test_responses_status_and_usage_rules() -> None:
    incomplete = _responses(_chat({"content": "1, 2"}, "length"))
    assert incomplete["status"] == "incomplete"
    assert incomplete["incomplete_details"] == {"reason": "max_output_tokens"}
    assert incomplete["output"][0]["status"] == "incomplete"
    filtered = _responses(_chat({"content": "x"}, "content_filter"))
    assert filtered["incomplete_details"] == {"reason": "content_filter"}
    assert _responses(_chat({"content": "x"}))["usage"] is None
    partial = _responses(
        _chat({"content": "x"}, usage={"prompt_tokens": 5, "completion_tokens": 2})
    )
    # Unreported details stay unknown (null): the capture must not read a made-up zero.
    assert partial["usage"] == {
        "input_tokens": 5,
        "input_tokens_details": {"cached_tokens": None},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": None},
        "total_tokens": 7,
    }


def test_responses_refusal_empty_answer_and_missing_ids() -> None:
    refusal = _responses(_chat({"content": None, "refusal": "No."}))
    assert refusal["output"][0]["content"] == [{"type": "refusal", "refusal": "No."}]
    for message in ({"content": None}, {"content": "  \n"}, {"content": ""}):
        empty = _responses(_chat(message))
        assert [item["type"] for item in empty["output"]] == ["message"]
        assert empty["output"][0]["content"][0]["text"] == (message["content"] or "")
    nameless = {"type": "function", "function": {"arguments": "{}"}}
    calls = _responses(_chat({"content": None, "tool_calls": [nameless, nameless]}))["output"]
    assert [(c["id"], c["call_id"], c["name"]) for c in calls] == [
        ("fc_abc_0", "call_abc_0", ""),
        ("fc_abc_1", "call_abc_1", ""),
    ]
    assert _responses(_chat({"content": "x"}), {"input": "x", "model": "policy"})["model"] == (
        "Qwen/Qwen3-8B"
    )
    assert _responses({"choices": []}, {"input": "x", "model": "policy"})["model"] == "policy"


def test_messages_full_object() -> None:
    chat = _chat(
        {"content": "Looking.", "reasoning": "Need weather.", "tool_calls": [TOOL_CALL]},
        "tool_calls",
        usage=USAGE,
    )
    message = _messages(chat)
    assert message == {
        "id": "msg_abc",
        "type": "message",
        "role": "assistant",
        "model": "Qwen/Qwen3-8B",
        "content": [
            {"type": "thinking", "thinking": "Need weather.", "signature": THINKING_SIGNATURE},
            {"type": "text", "text": "Looking."},
            {
                "type": "tool_use",
                "id": "chatcmpl-tool-1",
                "name": "weather",
                "input": {"city": "Paris"},
            },
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 36,
            "output_tokens": 40,
            "cache_read_input_tokens": 64,
            "output_tokens_details": {"thinking_tokens": 30},
        },
    }
    # tokens_in stays the chat prompt_tokens once the contract adds cached tokens back in.
    normalized = get_dialect("messages").normalize(message)
    assert (normalized.usage.tokens_in, normalized.usage.cached_tokens) == (100, 64)
    assert normalized.usage.tokens_total == 140


def test_messages_stop_reasons() -> None:
    request = {"max_tokens": 5, "messages": [], "stop_sequences": ["END"]}

    def stop(finish: str | None, **choice: Any) -> tuple[str, str | None]:
        chat = _chat({"content": "x"}, finish)
        chat["choices"][0].update(choice)
        message = _messages(chat, request)
        return message["stop_reason"], message["stop_sequence"]

    assert stop("stop") == ("end_turn", None)
    assert stop("stop", stop_reason="END") == ("stop_sequence", "END")
    assert stop("stop", stop_reason="NOT_ASKED") == ("end_turn", None)
    assert stop("stop", stop_reason=151645) == ("end_turn", None)
    assert stop("length") == ("max_tokens", None)
    assert stop("tool_calls") == ("tool_use", None)
    assert stop("content_filter") == ("refusal", None)
    assert stop(None) == ("end_turn", None)
    # vLLM answers a forced tool call with "stop".
    forced = _messages(_chat({"content": None, "tool_calls": [TOOL_CALL]}, "stop"))
    assert forced["stop_reason"] == "tool_use"


def test_messages_tool_inputs_and_usage_edges() -> None:
    def tool_input(arguments: Any) -> Any:
        call = {"id": "t", "type": "function", "function": {"name": "f", "arguments": arguments}}
        return _messages(_chat({"content": None, "tool_calls": [call]}))["content"][0]["input"]

    assert tool_input("") == {}
    assert tool_input("  ") == {}
    assert tool_input('{"a": [1]}') == {"a": [1]}
    assert tool_input("{bad") == "{bad"
    assert tool_input({"already": "parsed"}) == {"already": "parsed"}
    assert tool_input(None) == {}
    no_usage = _messages(_chat({"content": "x"}))
    assert no_usage["usage"] == {"input_tokens": 0, "output_tokens": 0}
    odd = _messages(
        _chat(
            {"content": "x"},
            usage={
                "prompt_tokens": 10,
                "completion_tokens": 1,
                "prompt_tokens_details": {"cached_tokens": 50},
            },
        )
    )
    assert odd["usage"] == {"input_tokens": 0, "output_tokens": 1, "cache_read_input_tokens": 10}
    blank = _messages(_chat({"content": " ", "reasoning_content": "\n"}))
    assert blank["content"] == []


_KEYS = [
    "choices", "message", "content", "tool_calls", "function", "arguments", "name", "id",
    "usage", "prompt_tokens", "finish_reason", "reasoning_content", "refusal", "index", "model",
    "stop_reason", "prompt_tokens_details", "cached_tokens", "tools", "metadata", "text",
]  # fmt: skip
_junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(_KEYS), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(_junk, _junk)
def test_malformed_answers_never_raise(chat: Any, request: Any) -> None:
    response = chat_response_to_responses(chat, request, response_id="resp_x", created_at=1)
    message = chat_response_to_messages(chat, request, message_id="msg_x")
    # Whatever came in, the result is JSON and reads back as its dialect.
    json.dumps(response)
    json.dumps(message)
    get_dialect("responses").normalize(response)
    get_dialect("messages").normalize(message)


def test_unreported_cached_and_reasoning_tokens_are_captured_as_unknown() -> None:
    partial = _responses(
        _chat({"content": "x"}, usage={"prompt_tokens": 5, "completion_tokens": 2})
    )
    usage = get_dialect("responses").normalize(partial).usage
    assert (usage.tokens_in, usage.tokens_out, usage.tokens_total) == (5, 2, 7)
    assert usage.cached_tokens is None
    assert usage.tokens_reasoning is None
