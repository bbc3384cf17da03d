"""Streamed translation: reassembles to the non-streamed translation, emits as chunks arrive."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollcap.dialects import StreamOutcome, reassemble
from rollcap.sse import SSEEvent
from rollcap.translate import THINKING_SIGNATURE, ChatToMessagesStream, ChatToResponsesStream
from tests.translate._support import (
    CHAT_FIXTURES,
    MESSAGE_ID,
    NAMESPACED_REQUEST,
    RESPONSE_ID,
    Answer,
    answers,
    decode,
    encode,
    expected_messages,
    expected_responses,
    namespaced_answers,
    to_messages,
    to_responses,
)

COMPLETE = [
    p for p in CHAT_FIXTURES if reassemble("chat", [p.read_bytes()]).outcome.value == "completed"
]


def _payloads(events: list[SSEEvent]) -> list[dict[str, Any]]:
    payloads = []
    for event in events:
        data = orjson.loads(event.data)
        assert event.event == data["type"]
        payloads.append(data)
    return payloads


def _delta_text(payload: dict[str, Any]) -> str:
    delta = payload["delta"]
    if isinstance(delta, str):
        return delta
    return str(next(value for key, value in delta.items() if key != "type"))


def _check_responses(upstream: list[SSEEvent], request: dict[str, Any] | None = None) -> None:
    out = to_responses(upstream, request)
    got = reassemble("responses", [encode(out)])
    expected = expected_responses(upstream, request)
    assert got.outcome is (
        StreamOutcome.COMPLETED if expected["status"] == "completed" else StreamOutcome.INCOMPLETE
    )
    assert got.response == expected
    payloads = _payloads(out)
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    assert payloads[0]["type"] == "response.created"
    assert payloads[1]["type"] == "response.in_progress"


def _check_messages(upstream: list[SSEEvent]) -> None:
    out = to_messages(upstream)
    got = reassemble("messages", [encode(out)])
    assert got.outcome is StreamOutcome.COMPLETED
    assert got.response == expected_messages(upstream)
    kinds = [p["type"] for p in _payloads(out)]
    assert kinds[0] == "message_start"
    assert kinds[-2:] == ["message_delta", "message_stop"]


@pytest.mark.parametrize("sse", COMPLETE, ids=lambda p: p.stem)
def test_golden_chat_streams_translate_to_responses(sse: Path) -> None:
    _check_responses(decode(sse.read_bytes()))


@pytest.mark.parametrize("sse", COMPLETE, ids=lambda p: p.stem)
def test_golden_chat_streams_translate_to_messages(sse: Path) -> None:
    _check_messages(decode(sse.read_bytes()))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers())
def test_generated_answers_translate_to_responses(answer: Answer) -> None:
    _check_responses(answer.chunks())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(namespaced_answers())
def test_generated_namespaced_calls_translate_to_responses(answer: Answer) -> None:
    _check_responses(answer.chunks(), NAMESPACED_REQUEST)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers())
def test_generated_answers_translate_to_messages(answer: Answer) -> None:
    _check_messages(answer.chunks())


def test_events_go_out_as_chunks_arrive() -> None:
    answer = Answer(
        reasoning=["Let me", " think."],
        content=["The answer", " is 4."],
        tools=[("call_1", "calc", ['{"x":', " 4}"])],
        finish_reason="tool_calls",
    )
    chunks = answer.chunks()
    for translator in (
        ChatToResponsesStream({"input": "x"}, response_id=RESPONSE_ID, created_at=1),
        ChatToMessagesStream({"max_tokens": 9, "messages": []}, message_id=MESSAGE_ID),
    ):
        per_chunk = [translator.feed(chunk) for chunk in chunks]
        texts = [
            [
                _delta_text(p)
                for p in _payloads(out)
                if "delta" in p and p["type"] != "message_delta"
            ]
            for out in per_chunk
        ]
        # Each content chunk's text leaves with that chunk, not at the end.
        assert texts[1] == ["Let me"]
        assert texts[2][-1] == " think."
        assert texts[3][-1] == "The answer"
        assert texts[4][-1] == " is 4."
        assert texts[5][-1] == '{"x":'
        assert texts[6][-1] == " 4}"
        assert translator.finish() == []


def test_messages_stream_event_sequence() -> None:
    answer = Answer(reasoning=["Hmm."], content=["Hi"], tools=[("toolu_9", "f", ['{"a": 1}'])])
    payloads = _payloads(to_messages(answer.chunks()))
    assert [(p["type"], p.get("index"), (p.get("delta") or {}).get("type")) for p in payloads] == [
        ("message_start", None, None),
        ("content_block_start", 0, None),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_start", 1, None),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_start", 2, None),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, None),
        ("content_block_stop", 1, None),
        ("content_block_stop", 2, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    assert payloads[7]["delta"]["signature"] == THINKING_SIGNATURE
    assert payloads[0]["message"]["usage"] == {"input_tokens": 0, "output_tokens": 0}
    assert payloads[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


def test_responses_stream_event_sequence() -> None:
    answer = Answer(reasoning=["Hmm."], content=["Hi"], tools=[("call_9", "f", ['{"a": 1}'])])
    payloads = _payloads(to_responses(answer.chunks()))
    assert [p["type"] for p in payloads] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert payloads[0]["response"]["status"] == "in_progress"
    assert payloads[0]["response"]["output"] == []
    final = payloads[-1]["response"]
    base = RESPONSE_ID.removeprefix("resp_")
    assert [item["id"] for item in final["output"]] == [f"rs_{base}", f"msg_{base}", f"fc_{base}_0"]
    assert final["output"][2]["call_id"] == "call_9"


def test_namespaced_calls_stream_with_their_namespace() -> None:
    answer = Answer(
        content=["Looking up."],
        tools=[
            ("call_1", "crm__lookup", ['{"email": ', '"a@b.c"}']),
            ("call_2", "weather", ["{}"]),
            ("call_3", "crm__missing", ["{}"]),
        ],
        finish_reason="tool_calls",
    )
    payloads = _payloads(to_responses(answer.chunks(), NAMESPACED_REQUEST))
    split = [("lookup", "crm"), ("weather", None), ("crm__missing", None)]
    for kind in ("response.output_item.added", "response.output_item.done"):
        items = [p["item"] for p in payloads if p["type"] == kind]
        calls = [item for item in items if item["type"] == "function_call"]
        assert [(c["name"], c.get("namespace")) for c in calls] == split, kind
        assert ["namespace" in c for c in calls] == [True, False, False], kind
    final = payloads[-1]
    assert final["type"] == "response.completed"
    calls = [item for item in final["response"]["output"] if item["type"] == "function_call"]
    assert [(c["name"], c.get("namespace")) for c in calls] == split
    assert final["response"]["tools"] == NAMESPACED_REQUEST["tools"]
    assert payloads[0]["response"]["tools"] == NAMESPACED_REQUEST["tools"]
    _check_responses(answer.chunks(), NAMESPACED_REQUEST)


def test_length_gives_response_incomplete() -> None:
    answer = Answer(content=["1, 2, 3"], finish_reason="length")
    payloads = _payloads(to_responses(answer.chunks()))
    final = payloads[-1]
    assert final["type"] == "response.incomplete"
    assert final["response"]["status"] == "incomplete"
    assert final["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["response"]["output"][0]["status"] == "incomplete"
    message = reassemble("messages", [encode(to_messages(answer.chunks()))]).response
    assert message is not None
    assert message["stop_reason"] == "max_tokens"


@pytest.mark.parametrize("translate", [to_responses, to_messages], ids=["responses", "messages"])
def test_truncated_upstream_gives_truncated_stream(translate: Any) -> None:
    for name in ("truncated", "truncated_after_finish"):
        raw = next(p for p in CHAT_FIXTURES if p.stem == name).read_bytes()
        out = translate(decode(raw))
        dialect = "responses" if translate is to_responses else "messages"
        got = reassemble(dialect, [encode(out)])
        assert got.outcome is StreamOutcome.TRUNCATED
        partial = reassemble("chat", [raw]).response
        assert partial is not None
        text = partial["choices"][0]["message"]["content"]
        assert got.response is not None
        if dialect == "responses":
            assert got.response["status"] == "in_progress"
            assert got.response["output"][0]["content"][0]["text"] == text
        else:
            assert got.response["stop_reason"] is None
            assert got.response["content"][0]["text"] == text


def test_error_chunk_gives_dialect_error_event() -> None:
    raw = next(p for p in CHAT_FIXTURES if p.stem == "error_midstream").read_bytes()
    upstream = decode(raw)
    out = to_responses(upstream)
    got = reassemble("responses", [encode(out)])
    assert got.outcome is StreamOutcome.ERROR
    assert got.error == {
        "code": "InternalServerError",
        "message": "The engine died unexpectedly while generating this request.",
        "param": None,
    }
    assert got.response is not None
    assert got.response["output"][0]["content"][0]["text"] == "Sure, here is a summary"
    assert _payloads(out)[-1]["type"] == "error"

    out = to_messages(upstream)
    got = reassemble("messages", [encode(out)])
    assert got.outcome is StreamOutcome.ERROR
    assert got.error == {
        "type": "api_error",
        "message": "The engine died unexpectedly while generating this request.",
    }
    assert out[-1].event == "error"


def test_error_before_any_chunk_is_the_only_event() -> None:
    error = SSEEvent(data='{"error": {"message": "overloaded", "code": 503}}')
    out = to_messages([error, SSEEvent(data="[DONE]")])
    assert [e.event for e in out] == ["error"]
    assert orjson.loads(out[0].data)["error"]["type"] == "overloaded_error"
    out = to_responses([error])
    assert [orjson.loads(e.data)["type"] for e in out] == ["error"]


def test_done_without_chunks_still_completes() -> None:
    done = [SSEEvent(data="[DONE]")]
    got = reassemble("responses", [encode(to_responses(done))])
    assert got.outcome is StreamOutcome.COMPLETED
    assert got.response == expected_responses(done)
    assert got.response["output"][0]["content"][0]["text"] == ""
    got = reassemble("messages", [encode(to_messages(done))])
    assert got.outcome is StreamOutcome.COMPLETED
    assert got.response == expected_messages(done)
    assert got.response["content"] == []


def test_noise_is_ignored() -> None:
    answer = Answer(content=["ok"])
    noisy = [SSEEvent(data="not json"), SSEEvent(data="[1, 2]"), SSEEvent(data="{}")]
    chunks = answer.chunks()
    assert to_responses(noisy + chunks) == to_responses(chunks)
    assert to_messages(noisy + chunks) == to_messages(chunks)
    # Anything after [DONE] is ignored.
    assert to_messages([*chunks, *chunks]) == to_messages(chunks)


def test_whitespace_only_text_opens_no_block() -> None:
    answer = Answer(
        reasoning=["\n\n"], content=["\n"], tools=[("c1", "f", ["{}"])], late_content=["\n"]
    )
    message = reassemble("messages", [encode(to_messages(answer.chunks()))]).response
    assert message is not None
    assert [block["type"] for block in message["content"]] == ["tool_use"]
    response = reassemble("responses", [encode(to_responses(answer.chunks()))]).response
    assert response is not None
    assert [item["type"] for item in response["output"]] == ["function_call"]


def test_tool_call_named_late_opens_when_named() -> None:
    # No name in the first fragment: the call opens when the name arrives, with what came before.
    chunks = Answer().chunks()[:1]
    for fragment in (
        {"index": 0, "id": "call_x", "function": {"arguments": '{"a"'}},
        {"index": 0, "function": {"name": "f", "arguments": ": 1}"}},
    ):
        chunks.append(Answer()._chunk({"tool_calls": [fragment]}))
    chunks += Answer(finish_reason="tool_calls").chunks()[-1:]
    messages = [orjson.loads(e.data) for e in to_messages(chunks)]
    starts = [m for m in messages if m["type"] == "content_block_start"]
    assert starts == [
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "call_x", "name": "f", "input": {}},
        }
    ]
    got = reassemble("messages", [encode(to_messages(chunks))]).response
    assert got == expected_messages(chunks)
    assert got is not None
    assert got["content"][0]["input"] == {"a": 1}


def test_unnamed_tool_call_opens_at_the_end() -> None:
    chunks = Answer().chunks()[:1]
    chunks.append(Answer()._chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}))
    chunks += Answer(finish_reason="tool_calls").chunks()[-1:]
    got = reassemble("responses", [encode(to_responses(chunks))]).response
    assert got == expected_responses(chunks)
    assert got is not None
    call = got["output"][0]
    base = RESPONSE_ID.removeprefix("resp_")
    assert (call["name"], call["call_id"], call["arguments"]) == ("", f"call_{base}_0", "{}")


def test_out_of_order_parts_still_stream_everything() -> None:
    # Text that first appears after a tool call: the order differs from the non-streamed one,
    # but nothing is lost and the stream stays well formed.
    answer = Answer(tools=[("c1", "f", ["{}"])], late_content=["after"], finish_reason="tool_calls")
    response = reassemble("responses", [encode(to_responses(answer.chunks()))])
    assert response.outcome is StreamOutcome.COMPLETED
    assert response.response is not None
    assert [item["type"] for item in response.response["output"]] == ["function_call", "message"]
    message = reassemble("messages", [encode(to_messages(answer.chunks()))]).response
    assert message is not None
    assert [block["type"] for block in message["content"]] == ["tool_use", "text"]


_CHUNK_KEYS = [
    "id", "object", "choices", "usage", "model", "index", "delta", "content", "reasoning",
    "reasoning_content", "refusal", "tool_calls", "function", "name", "arguments", "type",
    "finish_reason", "stop_reason", "error", "message", "code", "prompt_tokens",
]  # fmt: skip
_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**63) | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(_CHUNK_KEYS), children, max_size=5)
    ),
    max_leaves=25,
)
_events = st.builds(
    SSEEvent,
    data=st.one_of(
        st.just("[DONE]"),
        st.text(max_size=10),
        _values.map(lambda value: orjson.dumps(value).decode()),
    ),
    event=st.none() | st.sampled_from(["error", "message"]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_events, max_size=12), _values)
def test_streams_never_raise_on_junk(events: list[SSEEvent], request: Any) -> None:
    for translator in (
        ChatToResponsesStream(request, response_id=RESPONSE_ID, created_at=1),
        ChatToMessagesStream(request, message_id=MESSAGE_ID),
    ):
        out: list[SSEEvent] = []
        for event in events:
            out.extend(translator.feed(event))
        out.extend(translator.finish())
        for event in out:
            orjson.loads(event.data)
