"""Parents and deltas of captured calls, read in the canonical conversation form."""

from __future__ import annotations

from typing import Any

import pytest

from rollcap.report._delta import (
    answer_messages,
    canonical_call,
    request_messages,
    thread_calls,
)

SYSTEM = {"role": "system", "content": "Answer briefly."}
USER = {"role": "user", "content": "Capital of France?"}
TOOL_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"country": "France", "kind": "capital"}'},
        }
    ],
}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "Paris"}
ANSWER = {"role": "assistant", "content": "Paris."}


def chat_response(message: dict[str, Any]) -> dict[str, Any]:
    return {"object": "chat.completion", "choices": [{"index": 0, "message": message}]}


def chat_call(messages: list[Any], answer: dict[str, Any] | None, **params: Any) -> Any:
    request = {"model": "m", "messages": messages, **params}
    return canonical_call("chat", request, None if answer is None else chat_response(answer))


def test_request_messages_of_each_dialect_are_chat_messages() -> None:
    assert request_messages("chat", {"messages": [USER]}) == ([USER], {})
    messages, names = request_messages(
        "responses",
        {
            "instructions": "Answer briefly.",
            "input": [
                {"role": "user", "content": "Capital of France?"},
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "lookup",
                    "namespace": "geo",
                    "arguments": "{}",
                },
            ],
        },
    )
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert messages[2]["tool_calls"][0]["function"]["name"] == "geo__lookup"
    assert names == {}  # the request declares no namespaced tool
    messages, _ = request_messages(
        "messages",
        {"max_tokens": 8, "system": "Answer briefly.", "messages": [USER]},
    )
    assert messages == [SYSTEM, USER]
    with pytest.raises(ValueError, match="unknown dialect"):
        request_messages("grpc", {})


def test_answer_messages_of_each_dialect() -> None:
    assert answer_messages("chat", chat_response(ANSWER)) == [ANSWER]
    (message,) = answer_messages(
        "responses",
        {
            "output": [
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Paris."}],
                },
                {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
            ]
        },
    )
    assert message["content"] == "Paris."
    assert message["reasoning_content"] == "think"
    assert message["tool_calls"][0]["function"]["name"] == "lookup"
    (message,) = answer_messages(
        "messages",
        {
            "content": [
                {"type": "thinking", "thinking": "think", "signature": "s"},
                {"type": "text", "text": "Paris."},
                {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"a": 1}},
            ]
        },
    )
    assert message["reasoning_content"] == "think"
    assert message["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"a":1}'}
    with pytest.raises(ValueError, match="no answer"):
        answer_messages("chat", {"error": {"message": "rate limited"}})


def test_an_untranslatable_request_is_kept_as_it_came() -> None:
    call = canonical_call("responses", {"previous_response_id": "r1", "input": "x"}, None)
    assert call.messages is None
    assert call.request_error is not None
    assert "previous_response_id" in call.request_error
    assert call.request_fingerprints == []
    other = canonical_call("responses", {"previous_response_id": "r2", "input": "x"}, None)
    assert call.signature != other.signature
    missing = canonical_call("chat", None, None)
    assert missing.request_error == "no request object was captured"


def test_each_call_keeps_its_parents_conversation_and_adds_only_the_new_messages() -> None:
    calls = [
        chat_call([SYSTEM, USER], TOOL_CALL),
        chat_call([SYSTEM, USER, TOOL_CALL, RESULT], ANSWER),
        chat_call(
            [SYSTEM, USER, TOOL_CALL, RESULT, ANSWER, {"role": "user", "content": "Why?"}], ANSWER
        ),
    ]
    threads = thread_calls(calls)
    assert [(t.parent, t.keep) for t in threads] == [(None, 0), (0, 3), (1, 5)]
    assert threads[0].new == [SYSTEM, USER]
    assert threads[1].new == [RESULT]
    assert threads[2].new == [{"role": "user", "content": "Why?"}]


def test_an_answer_sent_back_with_other_ids_and_key_order_still_continues_its_call() -> None:
    echoed = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "other_id",
                "type": "function",
                "function": {
                    "name": "lookup",
                    "arguments": '{"kind":"capital","country":"France"}',
                },
            }
        ],
    }
    calls = [chat_call([USER], TOOL_CALL), chat_call([USER, echoed, RESULT], ANSWER)]
    assert thread_calls(calls)[1].keep == 2


def test_an_edited_answer_falls_back_to_the_parents_request() -> None:
    edited = {"role": "assistant", "content": "Lyon?"}
    calls = [chat_call([USER], ANSWER), chat_call([USER, edited, USER], ANSWER)]
    thread = thread_calls(calls)[1]
    assert (thread.parent, thread.keep) == (0, 1)
    assert thread.new == [edited, USER]


def test_a_retry_of_the_same_request_adds_nothing() -> None:
    calls = [chat_call([USER], None), chat_call([USER], ANSWER)]
    thread = thread_calls(calls)[1]
    assert (thread.parent, thread.keep, thread.new) == (0, 1, [])


def test_an_unrelated_conversation_has_no_parent() -> None:
    calls = [chat_call([USER], ANSWER), chat_call([{"role": "user", "content": "Other?"}], ANSWER)]
    assert thread_calls(calls)[1].parent is None


def test_anthropic_turns_thread_through_tool_use_and_tool_result() -> None:
    tool_use = {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"country": "France"}}
    first = canonical_call(
        "messages",
        {"max_tokens": 8, "messages": [USER]},
        {"content": [tool_use], "stop_reason": "tool_use"},
    )
    second = canonical_call(
        "messages",
        {
            "max_tokens": 8,
            "messages": [
                USER,
                {"role": "assistant", "content": [tool_use]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "Paris"}],
                },
            ],
        },
        None,
    )
    thread = thread_calls([first, second])[1]
    assert (thread.parent, thread.keep) == (0, 2)
    assert thread.new == [{"role": "tool", "tool_call_id": "t1", "content": "Paris"}]


def test_signatures_tell_requests_apart_by_messages_and_parameters() -> None:
    base = chat_call([USER], ANSWER)
    assert chat_call([USER], ANSWER).signature == base.signature
    assert chat_call([USER], None).signature == base.signature  # the answer is not the request
    assert chat_call([USER], ANSWER, temperature=0.5).signature != base.signature
    assert chat_call([{**USER, "content": "Capital of Spain?"}], ANSWER).signature != base.signature


def test_reusing_the_previous_calls_fingerprints_changes_nothing() -> None:
    history = [SYSTEM, USER, TOOL_CALL, RESULT, ANSWER]
    calls: list[list[Any]] = [
        history[:2],
        history[:4],
        history,
        [SYSTEM, {"role": "user", "content": "Other"}],
    ]
    previous = None
    for messages in calls:
        fresh = chat_call(messages, ANSWER)
        reused = canonical_call(
            "chat", {"model": "m", "messages": messages}, chat_response(ANSWER), previous=previous
        )
        assert reused.request_fingerprints == fresh.request_fingerprints
        assert reused.answer_fingerprints == fresh.answer_fingerprints
        assert reused.signature == fresh.signature
        previous = reused
