"""The Responses dialect: normalize, terminal events and reassembly edge cases.

Whole streams are covered by the golden fixtures in ``tests/fixtures/responses``.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollcap.dialects import responses
from rollcap.dialects._base import (
    PIECE_OVERHEAD,
    Normalized,
    Reassembly,
    StreamOutcome,
    ToolCall,
    Usage,
)
from rollcap.sse import SSEEvent

RID = "resp_68b0c1d2e3f48190a1b2c3d4e5f6a7b8"
MSG = "msg_68b0c1d3a4b58190b2c3d4e5f6a7b8c9"
FC = "fc_68b0c1d4b5c68190c3d4e5f6a7b8c9d0"
RS = "rs_68b0c1d5c6d78190d4e5f6a7b8c9d0e1"


def ev(kind: str, *, name: str | None = "same", **fields: Any) -> SSEEvent:
    """An event as the API sends it: the SSE name repeats the data's ``type``."""
    data = orjson.dumps({"type": kind, **fields}).decode()
    return SSEEvent(data=data, event=kind if name == "same" else name)


def run(*events: SSEEvent) -> Reassembly:
    reassembler = responses.StreamReassembler()
    for event in events:
        reassembler.feed(event)
    return reassembler.finish()


def snapshot(status: str = "in_progress", **over: Any) -> dict[str, Any]:
    return {
        "id": RID,
        "object": "response",
        "status": status,
        "model": "gpt-4.1-2025-04-14",
        "output": [],
        "usage": None,
        **over,
    }


def message_start(index: int = 0, item_id: str = MSG) -> list[SSEEvent]:
    return [
        ev(
            "response.output_item.added",
            output_index=index,
            item={"id": item_id, "type": "message", "status": "in_progress", "content": []},
        ),
        ev(
            "response.content_part.added",
            item_id=item_id,
            output_index=index,
            content_index=0,
            part={"type": "output_text", "annotations": [], "text": ""},
        ),
    ]


def text_delta(
    delta: object, index: object = 0, content_index: object = 0, **over: Any
) -> SSEEvent:
    fields: dict[str, Any] = {
        "item_id": MSG,
        "output_index": index,
        "content_index": content_index,
        "delta": delta,
    }
    fields.update(over)
    return ev("response.output_text.delta", **fields)


def output_of(result: Reassembly) -> list[Any]:
    assert result.response is not None
    output: list[Any] = result.response["output"]
    return output


# --- normalize -----------------------------------------------------------------------------------


def test_normalize_full_response() -> None:
    response = {
        "id": RID,
        "object": "response",
        "status": "completed",
        "model": "gpt-5-2025-08-07",
        "incomplete_details": None,
        "output": [
            {
                "id": RS,
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "Plan the lookup."}],
                "content": [
                    {"type": "reasoning_text", "text": "Weather needs a call."},
                    {"type": "something_else", "text": "not reasoning"},
                ],
            },
            {
                "id": FC,
                "type": "function_call",
                "status": "completed",
                "call_id": "call_abc",
                "name": "get_weather",
                "arguments": '{"location":"Oslo"}',
            },
            {
                "id": "ctc_1",
                "type": "custom_tool_call",
                "call_id": "call_def",
                "name": "run_sql",
                "input": "SELECT 1;",
            },
            {"id": MSG, "type": "message", "content": [{"type": "output_text", "text": "Hi"}]},
        ],
        "usage": {
            "input_tokens": 120,
            "input_tokens_details": {"cached_tokens": 64},
            "output_tokens": 80,
            "output_tokens_details": {"reasoning_tokens": 50},
            "total_tokens": 200,
        },
    }
    assert responses.normalize(response) == Normalized(
        response_id=RID,
        model="gpt-5-2025-08-07",
        response_status="completed",
        finish_reason=None,
        usage=Usage(
            tokens_in=120,  # cached tokens are inside input_tokens, not added again
            tokens_out=80,
            tokens_reasoning=50,
            tokens_total=200,
            cached_tokens=64,
            cache_creation_tokens=None,
        ),
        tool_calls=(
            ToolCall("call_abc", "get_weather", {"location": "Oslo"}),
            ToolCall("call_def", "run_sql", {"_raw": "SELECT 1;"}),
        ),
        reasoning_content="Plan the lookup.\nWeather needs a call.",
    )


@pytest.mark.parametrize("bad", [True, False, 3.0, 1.5, -1, "12", None, [], {}])
def test_normalize_rejects_non_counts(bad: object) -> None:
    usage = {
        "input_tokens": bad,
        "input_tokens_details": {"cached_tokens": bad},
        "output_tokens": bad,
        "output_tokens_details": {"reasoning_tokens": bad},
        "total_tokens": bad,
    }
    assert responses.normalize({"usage": usage}).usage == Usage()


@pytest.mark.parametrize(
    ("usage", "total"),
    [
        ({"input_tokens": 10, "output_tokens": 5, "total_tokens": 99}, 99),  # reported wins
        ({"input_tokens": 10, "output_tokens": 5}, 15),
        ({"input_tokens": 10, "output_tokens": 5, "total_tokens": 15.0}, 15),
        ({"input_tokens": 0, "output_tokens": 0}, 0),
        ({"input_tokens": 10}, None),
        ({"output_tokens": 5, "total_tokens": None}, None),
        ({"input_tokens": 10, "output_tokens": -5}, None),
        ({"total_tokens": 7}, 7),
    ],
)
def test_normalize_total_fallback(usage: dict[str, Any], total: int | None) -> None:
    assert responses.normalize({"usage": usage}).usage.tokens_total == total


def test_zero_counts_are_kept() -> None:
    usage = {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 0,
    }
    assert responses.normalize({"usage": usage}).usage == Usage(0, 0, 0, 0, 0, None)


@pytest.mark.parametrize("usage", [None, "usage", [], 3])
def test_missing_usage_is_all_unknown(usage: object) -> None:
    assert responses.normalize({"id": RID, "usage": usage}).usage == Usage()
    assert responses.normalize({"id": RID}).usage == Usage()


@pytest.mark.parametrize(
    ("arguments", "parsed"),
    [
        ('{"a": 1}', {"a": 1}),
        ('{"a": 1', {"_raw": '{"a": 1'}),
        ("not json", {"_raw": "not json"}),
        ("", {"_raw": ""}),
        ("[1, 2]", [1, 2]),
        ({"already": "parsed"}, {"already": "parsed"}),
        (None, None),
    ],
)
def test_tool_call_arguments(arguments: object, parsed: object) -> None:
    item = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": arguments}
    assert responses.normalize({"output": [item]}).tool_calls == (ToolCall("call_1", "f", parsed),)


@pytest.mark.parametrize(
    ("fields", "call_id"),
    [
        ({"call_id": "call_1", "id": FC}, "call_1"),
        ({"id": FC}, FC),
        ({"call_id": None, "id": FC}, FC),
        ({"call_id": 7, "id": FC}, FC),
        ({"call_id": 7, "id": 8}, None),
        ({}, None),
    ],
)
def test_tool_call_id_falls_back_to_item_id(fields: dict[str, Any], call_id: str | None) -> None:
    item = {"type": "function_call", "name": "f", "arguments": "{}", **fields}
    (call,) = responses.normalize({"output": [item]}).tool_calls
    assert call.call_id == call_id


def test_only_tool_call_items_are_tool_calls() -> None:
    output = [
        {"type": "message", "id": MSG, "content": []},
        {"type": "reasoning", "id": RS, "summary": []},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": "{}"},
    ]
    assert responses.normalize({"output": output}).tool_calls == (ToolCall("call_2", "g", {}),)


def test_finish_reason_and_status() -> None:
    response = {"status": "incomplete", "incomplete_details": {"reason": "content_filter"}}
    normalized = responses.normalize(response)
    assert (normalized.response_status, normalized.finish_reason) == (
        "incomplete",
        "content_filter",
    )
    assert responses.normalize({"incomplete_details": {"reason": 3}}).finish_reason is None
    assert responses.normalize({"incomplete_details": "max_output_tokens"}).finish_reason is None


@pytest.mark.parametrize(
    ("output", "reasoning"),
    [
        ([], None),
        ([{"type": "reasoning", "summary": []}], None),
        ([{"type": "reasoning", "summary": [{"type": "summary_text", "text": ""}]}], None),
        (
            [
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "a"}]},
                {"type": "message", "content": [{"type": "output_text", "text": "answer"}]},
                {
                    "type": "reasoning",
                    "summary": [{"type": "summary_text", "text": "b"}, "junk"],
                    "content": [{"type": "reasoning_text", "text": "c"}, {"text": "untyped"}],
                },
            ],
            "a\nb\nc",
        ),
        ([{"type": "reasoning", "summary": "text", "content": {"text": "x"}}], None),
    ],
)
def test_reasoning_content(output: list[Any], reasoning: str | None) -> None:
    assert responses.normalize({"output": output}).reasoning_content == reasoning


@pytest.mark.parametrize(
    "response",
    [
        None,
        [],
        "resp",
        3,
        {},
        {"id": 3, "model": [], "status": {}},
        {"output": "x"},
        {"output": [1, None, "x", {"type": "function_call"}, {"type": "reasoning"}]},
        {"output": [{"type": "function_call", "name": {}, "arguments": 5}]},
        {"usage": {"input_tokens_details": [], "output_tokens_details": "x"}},
    ],
)
def test_normalize_never_raises(response: Any) -> None:
    assert isinstance(responses.normalize(response), Normalized)


# --- is_terminal_event ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind", ["response.completed", "response.incomplete", "response.failed", "error"]
)
def test_terminal_events(kind: str) -> None:
    assert responses.is_terminal_event(ev(kind, response=snapshot()))
    # Servers that send data lines only: the data's type decides.
    assert responses.is_terminal_event(ev(kind, name=None, response=snapshot()))


@pytest.mark.parametrize(
    "event",
    [
        ev("response.created", response=snapshot()),
        ev("response.in_progress", response=snapshot()),
        ev("response.output_text.done", text="an error occurred, it failed, not completed"),
        text_delta("error"),
        text_delta("completed"),
        ev("response.output_item.done", item={"type": "message", "status": "completed"}),
        SSEEvent(data="not json", event="response.completed"),
        SSEEvent(data="[DONE]"),
        SSEEvent(data='["error"]', event="error"),
        SSEEvent(data="", event="error"),
    ],
)
def test_non_terminal_events(event: SSEEvent) -> None:
    assert not responses.is_terminal_event(event)


def test_terminal_event_type_comes_from_data_first() -> None:
    completed = '{"type":"response.completed","response":{}}'
    assert responses.is_terminal_event(SSEEvent(data=completed, event="response.output_text.delta"))
    delta = '{"type":"response.output_text.delta","delta":"x"}'
    assert not responses.is_terminal_event(SSEEvent(data=delta, event="response.completed"))
    # No type in the data: the SSE event name decides.
    assert responses.is_terminal_event(SSEEvent(data='{"message":"boom"}', event="error"))
    # A type hidden behind a JSON escape is still seen.
    escaped = '{"type":"response.\\u0063ompleted"}'
    assert responses.is_terminal_event(SSEEvent(data=escaped))


# --- reassembly ----------------------------------------------------------------------------------


def test_no_events_at_all() -> None:
    assert run() == Reassembly(None, StreamOutcome.TRUNCATED, None)


@pytest.mark.parametrize(
    "data", ["", "garbage", "{", "[DONE]", "null", "3", '"text"', "[1, 2]", '{"type": 5}', "{}"]
)
def test_garbage_events_are_ignored(data: str) -> None:
    assert run(SSEEvent(data=data), SSEEvent(data=data, event="response.delta")) == Reassembly(
        None, StreamOutcome.TRUNCATED, None
    )


def test_garbage_terminal_is_not_an_ending() -> None:
    result = run(
        ev("response.created", response=snapshot()),
        SSEEvent(data="{oops", event="response.completed"),
    )
    assert result == Reassembly(snapshot(), StreamOutcome.TRUNCATED, None)


@given(st.lists(st.text(max_size=8), max_size=40))
def test_rebuilt_text_is_the_concatenated_deltas(deltas: list[str]) -> None:
    events = [ev("response.created", response=snapshot()), *message_start()]
    events += [text_delta(d) for d in deltas]
    result = run(*events)
    assert result.outcome is StreamOutcome.TRUNCATED
    assert output_of(result)[0]["content"][0]["text"] == "".join(deltas)


def test_many_deltas() -> None:
    deltas = [f"tok{i} " for i in range(20_000)]
    result = run(*message_start(), *(text_delta(d) for d in deltas))
    assert output_of(result)[0]["content"][0]["text"] == "".join(deltas)


def test_rebuild_without_snapshot_has_only_output() -> None:
    result = run(*message_start(), text_delta("Hi"))
    assert result.response == {
        "output": [
            {
                "id": MSG,
                "type": "message",
                "status": "in_progress",
                "content": [{"type": "output_text", "annotations": [], "text": "Hi"}],
            }
        ]
    }


def test_latest_snapshot_wins_but_keeps_items() -> None:
    result = run(
        ev("response.created", response=snapshot("queued")),
        *message_start(),
        text_delta("Hello"),
        ev("response.in_progress", response=snapshot("in_progress", temperature=0.2)),
    )
    assert result.response is not None
    assert result.response["status"] == "in_progress"
    assert result.response["temperature"] == 0.2
    assert output_of(result)[0]["content"][0]["text"] == "Hello"


def test_snapshot_items_are_used() -> None:
    item = {"id": MSG, "type": "message", "content": [{"type": "output_text", "text": "A"}]}
    result = run(
        ev("response.in_progress", response=snapshot(output=[item, "junk"])), text_delta("B")
    )
    assert output_of(result) == [
        {"id": MSG, "type": "message", "content": [{"type": "output_text", "text": "AB"}]}
    ]


def test_events_for_missing_items_or_parts_are_ignored() -> None:
    result = run(
        text_delta("lost", index=0),  # before any item
        ev("response.function_call_arguments.delta", output_index=4, delta="{"),
        ev("response.reasoning_summary_text.delta", item_id="rs_x", summary_index=0, delta="x"),
        *message_start(),
        text_delta("skipped", content_index=5),  # part index beyond the next free slot
        ev("response.content_part.added", output_index=0, content_index=3, part={"type": "x"}),
        text_delta("kept"),
        text_delta("bad index", content_index=-1),
        text_delta("bad index", content_index="0"),
        text_delta(7),
        ev("response.output_item.added", output_index=-1, item={"id": "x"}),
        ev("response.output_item.added", output_index=1, item="not an item"),
    )
    assert output_of(result) == [
        {
            "id": MSG,
            "type": "message",
            "status": "in_progress",
            "content": [{"type": "output_text", "annotations": [], "text": "kept"}],
        }
    ]


def test_item_found_by_id_when_index_missing() -> None:
    result = run(*message_start(), text_delta("x", index=None), text_delta("y", index=9))
    assert output_of(result)[0]["content"][0]["text"] == "xy"


def test_first_delta_opens_a_missing_part() -> None:
    added = message_start()[0]
    result = run(
        added,
        text_delta("Hi"),
        ev("response.refusal.delta", item_id=MSG, output_index=0, content_index=1, delta="No"),
    )
    assert output_of(result)[0]["content"] == [
        {"type": "output_text", "annotations": [], "text": "Hi"},
        {"type": "refusal", "refusal": "No"},
    ]


def test_done_events_replace_text_and_items() -> None:
    part = {"type": "output_text", "annotations": [], "text": "final"}
    events = [*message_start(), text_delta("draf")]
    result = run(
        *events, ev("response.output_text.done", output_index=0, content_index=0, text="X")
    )
    assert output_of(result)[0]["content"][0]["text"] == "X"
    result = run(
        *events,
        ev("response.content_part.done", output_index=0, content_index=0, part=part),
        text_delta("!"),
    )
    assert output_of(result)[0]["content"][0]["text"] == "final!"
    item = {"id": MSG, "type": "message", "status": "completed", "content": [part]}
    result = run(*events, ev("response.output_item.done", output_index=0, item=item))
    assert output_of(result) == [item]


def test_repeated_added_events_keep_progress() -> None:
    start = message_start()
    result = run(*start, text_delta("a"), *start, text_delta("b"))
    assert output_of(result)[0]["content"][0]["text"] == "ab"


def test_refusal_reasoning_text_and_custom_tool_input() -> None:
    result = run(
        ev(
            "response.output_item.added",
            output_index=0,
            item={"id": RS, "type": "reasoning", "summary": []},
        ),
        ev(
            "response.reasoning_summary_part.added",
            item_id=RS,
            output_index=0,
            summary_index=0,
            part={"type": "summary_text", "text": ""},
        ),
        ev("response.reasoning_summary_text.delta", output_index=0, summary_index=0, delta="S1"),
        ev("response.reasoning_summary_text.delta", output_index=0, summary_index=0, delta="S2"),
        ev("response.reasoning_text.delta", output_index=0, content_index=0, delta="R1"),
        ev("response.reasoning_text.done", output_index=0, content_index=0, text="R1R2"),
        ev(
            "response.output_item.added",
            output_index=1,
            item={"id": "ctc_1", "type": "custom_tool_call", "call_id": "call_c", "name": "sh"},
        ),
        ev("response.custom_tool_call_input.delta", output_index=1, delta="ls "),
        ev("response.custom_tool_call_input.delta", item_id="ctc_1", delta="-la"),
        *message_start(index=2),
        ev("response.refusal.delta", output_index=2, content_index=0, delta="I can't"),
        ev("response.refusal.delta", output_index=2, content_index=0, delta=" help."),
    )
    reasoning, custom, message = output_of(result)
    assert reasoning["summary"] == [{"type": "summary_text", "text": "S1S2"}]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "R1R2"}]
    assert custom["input"] == "ls -la"
    # The part opened as output_text; the refusal text lands in its "refusal" field.
    assert message["content"][0]["refusal"] == "I can't help."
    assert result.response is not None
    normalized = responses.normalize(result.response)
    assert normalized.reasoning_content == "S1S2\nR1R2"
    assert normalized.tool_calls == (ToolCall("call_c", "sh", {"_raw": "ls -la"}),)


def test_annotations_are_collected() -> None:
    citation = {"type": "url_citation", "url": "https://example.com", "title": "Example"}
    added: dict[str, Any] = {"output_index": 0, "content_index": 0}
    result = run(
        *message_start(),
        ev(
            "response.output_text.annotation.added",
            annotation_index=0,
            annotation=citation,
            **added,
        ),
        ev(
            "response.output_text.annotation.added",
            annotation_index=0,
            annotation=citation,
            **added,
        ),
        ev("response.output_text.annotation.added", annotation=citation, **added),
        ev("response.output_text.annotation.added", annotation="junk", **added),
    )
    assert output_of(result)[0]["content"][0]["annotations"] == [citation, citation]


def test_function_call_rebuild_keeps_partial_arguments() -> None:
    item = {"id": FC, "type": "function_call", "call_id": "call_9", "name": "f", "arguments": ""}
    result = run(
        ev("response.output_item.added", output_index=0, item=item),
        ev("response.function_call_arguments.delta", item_id=FC, output_index=0, delta='{"q":'),
        ev("response.function_call_arguments.delta", item_id=FC, output_index=0, delta='"x"'),
    )
    assert result.response is not None
    assert responses.normalize(result.response).tool_calls == (
        ToolCall("call_9", "f", {"_raw": '{"q":"x"'}),
    )
    done = ev("response.function_call_arguments.done", output_index=0, arguments='{"q":"x"}')
    result = run(ev("response.output_item.added", output_index=0, item=item), done)
    assert output_of(result)[0]["arguments"] == '{"q":"x"}'


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        (
            {"code": "server_error", "message": "boom", "param": None},
            {"code": "server_error", "message": "boom", "param": None},
        ),
        ({"message": "boom", "sequence_number": 4}, {"message": "boom"}),
        ({}, {}),
        (
            {"error": {"type": "server_error", "code": None, "message": "boom"}, "code": "x"},
            {"type": "server_error", "code": None, "message": "boom"},
        ),
    ],
)
def test_error_event(fields: dict[str, Any], error: dict[str, Any]) -> None:
    result = run(ev("response.created", response=snapshot()), ev("error", **fields))
    assert result == Reassembly(snapshot(), StreamOutcome.ERROR, error)
    assert run(ev("error", **fields)) == Reassembly(None, StreamOutcome.ERROR, error)


def test_error_then_failed() -> None:
    failed = snapshot("failed", error={"code": "server_error", "message": "failed"})
    result = run(ev("error", code="x", message="first"), ev("response.failed", response=failed))
    assert result == Reassembly(failed, StreamOutcome.ERROR, failed["error"])
    failed_without_error = snapshot("failed", error=None)
    result = run(
        ev("error", code="x", message="first"),
        ev("response.failed", response=failed_without_error),
    )
    assert result == Reassembly(
        failed_without_error, StreamOutcome.ERROR, {"code": "x", "message": "first"}
    )
    assert run(ev("response.failed", response=failed_without_error)) == Reassembly(
        failed_without_error, StreamOutcome.ERROR, None
    )


def test_error_outcome_survives_a_later_completed() -> None:
    done = snapshot("completed")
    result = run(ev("error", message="boom"), ev("response.completed", response=done))
    assert result == Reassembly(done, StreamOutcome.ERROR, {"message": "boom"})


def test_events_after_the_terminal_are_ignored() -> None:
    done = snapshot("completed")
    result = run(
        ev("response.completed", response=done),
        ev("error", message="late"),
        ev("response.incomplete", response=snapshot("incomplete")),
        *message_start(),
    )
    assert result == Reassembly(done, StreamOutcome.COMPLETED, None)


def test_terminal_without_response_object_uses_the_rebuild() -> None:
    result = run(
        ev("response.created", response=snapshot()),
        *message_start(),
        text_delta("partial"),
        ev("response.incomplete", response="nope"),
    )
    assert result.outcome is StreamOutcome.INCOMPLETE
    assert output_of(result)[0]["content"][0]["text"] == "partial"


def test_unknown_events_are_ignored() -> None:
    events = [ev("response.created", response=snapshot()), *message_start(), text_delta("a")]
    noise = [
        ev("response.web_search_call.searching", output_index=0, item_id="ws_1"),
        ev("response.future_event", output_index=0, delta="zzz"),
        ev("keepalive"),
    ]
    assert run(*events, *noise) == run(*events)


def test_finish_is_repeatable_and_feeding_may_continue() -> None:
    reassembler = responses.StreamReassembler()
    for event in [*message_start(), text_delta("a")]:
        reassembler.feed(event)
    first = reassembler.finish()
    assert reassembler.finish() == first
    reassembler.feed(text_delta("b"))
    assert output_of(reassembler.finish())[0]["content"][0]["text"] == "ab"


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-2, 3)
    | st.floats(allow_nan=False)
    | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
_TYPES = st.sampled_from(
    [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.delta",
        "response.output_text.done",
        "response.output_text.annotation.added",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.done",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.delta",
        "response.completed",
        "response.incomplete",
        "response.failed",
        "error",
        "other",
    ]
)
_INDEX = st.integers(-1, 2) | _JSON
_EVENT_DATA = st.fixed_dictionaries(
    {"type": _TYPES | _JSON},
    optional={
        "output_index": _INDEX,
        "content_index": _INDEX,
        "summary_index": _INDEX,
        "annotation_index": _INDEX,
        "item_id": st.sampled_from([MSG, FC]) | _JSON,
        "delta": st.text(max_size=3) | _JSON,
        "text": st.text(max_size=3) | _JSON,
        "item": st.fixed_dictionaries(
            {"id": st.sampled_from([MSG, FC])},
            optional={"content": _JSON, "summary": _JSON, "type": _JSON, "arguments": _JSON},
        )
        | _JSON,
        "part": st.fixed_dictionaries({}, optional={"text": _JSON}) | _JSON,
        "annotation": _JSON,
        "response": st.fixed_dictionaries({}, optional={"output": _JSON, "error": _JSON}) | _JSON,
        "error": _JSON,
    },
)
_EVENTS = st.lists(
    st.builds(
        lambda data, name: SSEEvent(data=orjson.dumps(data).decode(), event=name),
        _EVENT_DATA,
        st.none() | _TYPES,
    )
    | st.builds(SSEEvent, st.text(max_size=12), st.none() | _TYPES),
    max_size=25,
)


@given(_EVENTS)
def test_reassembly_never_raises(events: list[SSEEvent]) -> None:
    result = run(*events)
    assert isinstance(result.outcome, StreamOutcome)
    if result.response is not None:
        responses.normalize(result.response)
    for event in events:
        responses.is_terminal_event(event)


def _fixture_events() -> list[tuple[str, list[SSEEvent]]]:
    from pathlib import Path

    from rollcap.sse import SSEDecoder

    root = Path(__file__).parent.parent / "fixtures" / "responses"
    out = []
    for path in sorted(root.glob("*.sse")):
        decoder = SSEDecoder()
        events = decoder.feed(path.read_bytes()) + decoder.flush(dispatch_unterminated=True)
        out.append((path.stem, events))
    return out


def _both(events: list[SSEEvent]) -> tuple[Reassembly, Reassembly]:
    deferring, eager = responses.StreamReassembler(), responses.StreamReassembler(defer=False)
    for event in events:
        deferring.feed(event)
        eager.feed(event)
    return deferring.finish(), eager.finish()


@pytest.mark.parametrize(("name", "events"), _fixture_events())
def test_deferring_piecewise_events_never_changes_the_result(
    name: str, events: list[SSEEvent]
) -> None:
    # Whole streams, streams cut before their terminal event (the answer is then rebuilt from
    # every event), and a terminal or error event disguised under a piecewise event name.
    terminal = max(
        (i for i, e in enumerate(events) if e.event in responses._RESPONSE_TERMINALS), default=None
    )
    variants = [events]
    if terminal is not None:
        variants.append(events[:terminal])
        variants.append([*events[:terminal], *events[terminal + 1 :]])
    disguised = SSEEvent(
        data='{"type":"error","code":"server_error","message":"boom"}',
        event="response.output_text.delta",
    )
    variants.append([*events[: len(events) // 2], disguised, *events[len(events) // 2 :]])
    for variant in variants:
        deferred, eager = _both(variant)
        assert deferred == eager, name


def test_deferred_events_past_their_bound_are_applied_and_the_answer_is_the_same() -> None:
    # Deltas wait, unparsed, for a final response that makes them unneeded; past 256 KiB of
    # them they are applied as they come, so a long stream holds its answer, not its events.
    deltas = [text_delta("word " * 200) for _ in range(400)]  # ~460 KiB of events
    events = [ev("response.created", response=snapshot()), *message_start(), *deltas]
    deferring = responses.StreamReassembler()
    applying = responses.StreamReassembler(defer=False)
    sizes = []
    for event in events:
        deferring.feed(event)
        applying.feed(event)
        sizes.append(deferring.size)
    assert deferring.finish() == applying.finish()  # cut short: rebuilt from the events
    text = "word " * 200 * 400
    assert output_of(deferring.finish())[0]["content"][0]["text"] == text
    # What it holds grows with the text once past the bound, not with the events' JSON.
    assert max(sizes) < 2 * (len(text) + 400 * PIECE_OVERHEAD)
    assert deferring.size == applying.size


def test_a_final_response_lets_the_deferred_events_go() -> None:
    reassembler = responses.StreamReassembler()
    final = snapshot("completed", output=[{"id": MSG, "type": "message", "content": []}])
    for event in [*message_start(), text_delta("hi"), ev("response.completed", response=final)]:
        reassembler.feed(event)
    assert reassembler.finish().response == final
    assert reassembler._events == []
