"""Each dialect's conversation in the GenAI message schema, and the content cap."""

from __future__ import annotations

from typing import Any

import orjson

from rollcap.report._otel_content import (
    cap_json_list,
    input_messages,
    output_messages,
    system_instructions,
    tool_definitions,
)
from rollcap.testing import expected_response

SCHEMA = {"type": "object", "properties": {"letter": {"type": "string"}}}


def test_chat_conversation_with_a_tool_round_trip() -> None:
    request: dict[str, Any] = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Pick"}]},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "A looks right",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "pick", "arguments": '{"letter": "A"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
        ],
        "tools": [{"type": "function", "function": {"name": "pick", "parameters": SCHEMA}}],
    }
    assert input_messages("chat", request) == [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {"role": "user", "parts": [{"type": "text", "content": "Pick"}]},
        {
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "content": "A looks right"},
                {"type": "tool_call", "id": "call_1", "name": "pick", "arguments": {"letter": "A"}},
            ],
        },
        {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": "call_1", "response": "ok"}],
        },
    ]
    # Chat system messages stay where the client put them.
    assert system_instructions("chat", request) is None
    assert tool_definitions("chat", request) == [
        {"type": "function", "name": "pick", "parameters": SCHEMA}
    ]


def test_chat_answer_has_one_message_per_choice() -> None:
    request = {
        "model": "m",
        "messages": [{"role": "user", "content": "Pick"}],
        "tools": [{"type": "function", "function": {"name": "pick", "parameters": SCHEMA}}],
    }
    response = expected_response("chat", request, {"x-fake-scenario": "tool"})
    [message] = output_messages("chat", response, None) or []
    assert message["role"] == "assistant"
    assert message["finish_reason"] == "tool_calls"
    [call] = [p for p in message["parts"] if p["type"] == "tool_call"]
    assert call["name"] == "pick"
    assert isinstance(call["arguments"], dict)


def test_responses_items_instructions_and_answer() -> None:
    request: dict[str, Any] = {
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Pick"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
            {"type": "function_call", "call_id": "c1", "name": "pick", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "done"},
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        ],
        "tools": [{"type": "function", "name": "pick", "parameters": SCHEMA}],
    }
    assert system_instructions("responses", request) == [{"type": "text", "content": "Be brief."}]
    messages = input_messages("responses", request) or []
    assert [m["role"] for m in messages] == ["user", "assistant", "assistant", "tool", "assistant"]
    assert messages[1]["parts"] == [{"type": "reasoning", "content": "think"}]
    assert messages[2]["parts"][0] == {
        "type": "tool_call",
        "id": "c1",
        "name": "pick",
        "arguments": {},
    }
    assert messages[3]["parts"][0]["response"] == "done"
    assert messages[4]["parts"][0]["type"] == "web_search_call"  # kept as a generic part
    assert tool_definitions("responses", request) == request["tools"]
    assert input_messages("responses", {"input": "Hi"}) == [
        {"role": "user", "parts": [{"type": "text", "content": "Hi"}]}
    ]

    answer = expected_response(
        "responses", {"model": "m", "input": "Why?"}, {"x-fake-scenario": "reasoning"}
    )
    [message] = output_messages("responses", answer, None) or []
    assert "finish_reason" not in message  # a completed Responses answer reports none
    assert [p["type"] for p in message["parts"]] == ["reasoning", "text"]


def test_messages_system_blocks_and_answer() -> None:
    request: dict[str, Any] = {
        "model": "m",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": "Pick"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "tool_use", "id": "tu_1", "name": "pick", "input": {"letter": "B"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "tu_1",
                        "content": [{"type": "text", "text": "ok"}],
                    }
                ],
            },
        ],
        "tools": [{"name": "pick", "description": "Pick one", "input_schema": SCHEMA}],
    }
    assert system_instructions("messages", request) == [{"type": "text", "content": "Be brief."}]
    messages = input_messages("messages", request) or []
    assert messages[1]["parts"] == [
        {"type": "reasoning", "content": "hmm"},
        {"type": "tool_call", "id": "tu_1", "name": "pick", "arguments": {"letter": "B"}},
    ]
    assert messages[2]["parts"] == [{"type": "tool_call_response", "id": "tu_1", "response": "ok"}]
    assert tool_definitions("messages", request) == [
        {"type": "function", "name": "pick", "description": "Pick one", "parameters": SCHEMA}
    ]
    answer = expected_response("messages", request, {"x-fake-scenario": "tool"})
    [message] = output_messages("messages", answer, "tool_use") or []
    assert message["finish_reason"] == "tool_use"
    assert message["parts"][-1]["type"] == "tool_call"


def test_error_bodies_and_junk_give_nothing_and_never_raise() -> None:
    error = {"error": {"type": "rate_limit_error", "message": "slow down"}}
    for dialect in ("chat", "responses", "messages", "other"):
        assert output_messages(dialect, error, None) is None
        assert output_messages(dialect, None, None) is None
        assert input_messages(dialect, None) is None
        assert tool_definitions(dialect, {"tools": "x"}) is None
        junk: dict[str, Any] = {"messages": [1, None, {"content": 5}], "input": [3], "system": 7}
        input_messages(dialect, junk)
        system_instructions(dialect, junk)


def test_cap_keeps_the_newest_items_whole() -> None:
    items = [{"n": i, "text": "x" * 10} for i in range(10)]
    whole, cut = cap_json_list(items, 10_000)
    assert not cut
    assert orjson.loads(whole) == items

    text, cut = cap_json_list(items, 100)
    assert cut
    assert len(text.encode()) <= 100
    kept = orjson.loads(text)  # still valid JSON
    assert kept == items[-len(kept) :]
    assert kept


def test_cap_cuts_a_single_huge_item_at_a_character_boundary() -> None:
    text, cut = cap_json_list([{"text": "é" * 100}], 51)
    assert cut
    assert len(text.encode()) <= 51
    assert text.startswith('[{"text":"é')
