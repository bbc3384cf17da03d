"""The Anthropic Messages dialect: normalize, terminal events, and reassembly edge cases.

Whole streams are covered by the golden fixtures in ``tests/fixtures/messages``.
"""

from __future__ import annotations

from typing import Any, cast

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollcap.dialects import messages
from rollcap.dialects._base import PIECE_OVERHEAD, Normalized, StreamOutcome, ToolCall, Usage
from rollcap.sse import SSEEvent


def _event(payload: object, name: str | None = "") -> SSEEvent:
    """``payload`` as an SSE event, named after its ``type`` unless ``name`` is given."""
    if name == "":
        name = payload.get("type") if isinstance(payload, dict) else None
    return SSEEvent(data=orjson.dumps(payload).decode(), event=name)


def _reassemble(*events: SSEEvent | dict[str, Any]) -> Any:
    reassembler = messages.StreamReassembler()
    for event in events:
        reassembler.feed(event if isinstance(event, SSEEvent) else _event(event))
    return reassembler.finish()


def _start(**message: Any) -> dict[str, Any]:
    skeleton: dict[str, Any] = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-20250514",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }
    skeleton.update(message)
    return {"type": "message_start", "message": skeleton}


def _block_start(index: object, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: object, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def _json_delta(index: int, text: str) -> dict[str, Any]:
    return _delta(index, {"type": "input_json_delta", "partial_json": text})


STOP = {"type": "message_stop"}
TOOL = {"type": "tool_use", "id": "toolu_01", "name": "lookup", "input": {}}


# --- normalize -------------------------------------------------------------------------------


def _usage(**usage: Any) -> Usage:
    return messages.normalize({"usage": usage}).usage


def test_normalize_reads_a_message() -> None:
    message = {
        "id": "msg_01AbC",
        "type": "message",
        "role": "assistant",
        "model": "claude-opus-4-1-20250805",
        "content": [
            {"type": "thinking", "thinking": "First idea.", "signature": "sig"},
            {"type": "redacted_thinking", "data": "EmwKAhgB"},
            {"type": "thinking", "thinking": "Second idea.", "signature": "sig"},
            {"type": "text", "text": "Looking it up."},
            {"type": "tool_use", "id": "toolu_01", "name": "search", "input": {"q": "rollcap"}},
            {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search", "input": {}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 100, "output_tokens": 40},
    }
    assert messages.normalize(message) == Normalized(
        response_id="msg_01AbC",
        model="claude-opus-4-1-20250805",
        response_status=None,
        finish_reason="tool_use",
        usage=Usage(
            tokens_in=100,
            tokens_out=40,
            tokens_reasoning=None,
            tokens_total=140,
            cached_tokens=None,
            cache_creation_tokens=None,
        ),
        tool_calls=(
            ToolCall("toolu_01", "search", {"q": "rollcap"}),
            ToolCall("srvtoolu_01", "web_search", {}),
        ),
        reasoning_content="First idea.\nSecond idea.",
    )


@pytest.mark.parametrize("bad", [True, False, 3.0, 2.5, -1, "12", None, [1], {"n": 1}])
def test_a_count_that_is_not_a_non_negative_int_is_unknown(bad: object) -> None:
    usage = _usage(
        input_tokens=bad,
        output_tokens=bad,
        cache_read_input_tokens=bad,
        cache_creation_input_tokens=bad,
    )
    assert usage == Usage()


def test_cache_counts_are_added_into_tokens_in() -> None:
    usage = _usage(
        input_tokens=14,
        cache_read_input_tokens=2048,
        cache_creation_input_tokens=312,
        output_tokens=11,
    )
    assert usage == Usage(
        tokens_in=2374,
        tokens_out=11,
        tokens_total=2385,
        cached_tokens=2048,
        cache_creation_tokens=312,
    )


def test_a_missing_or_invalid_cache_count_adds_nothing() -> None:
    assert _usage(input_tokens=5, cache_read_input_tokens=7).tokens_in == 12
    assert _usage(input_tokens=5, cache_creation_input_tokens=7).tokens_in == 12
    assert _usage(input_tokens=5, cache_read_input_tokens=-7).tokens_in == 5
    usage = _usage(input_tokens=5, cache_read_input_tokens=0, cache_creation_input_tokens=0)
    assert (usage.tokens_in, usage.cached_tokens, usage.cache_creation_tokens) == (5, 0, 0)


def test_tokens_in_is_unknown_without_input_tokens() -> None:
    usage = _usage(cache_read_input_tokens=2048, cache_creation_input_tokens=3, output_tokens=9)
    assert usage == Usage(
        tokens_in=None,
        tokens_out=9,
        tokens_total=None,
        cached_tokens=2048,
        cache_creation_tokens=3,
    )


def test_tokens_total_prefers_a_reported_total() -> None:
    assert _usage(input_tokens=5, output_tokens=3, total_tokens=10).tokens_total == 10
    assert _usage(input_tokens=5, output_tokens=3, total_tokens=True).tokens_total == 8
    assert _usage(input_tokens=5, total_tokens=-1).tokens_total is None
    assert _usage(output_tokens=3).tokens_total is None


def test_tokens_reasoning_is_always_unknown() -> None:
    usage = _usage(
        input_tokens=1,
        output_tokens=2,
        reasoning_tokens=5,
        output_tokens_details={"reasoning_tokens": 5},
    )
    assert usage.tokens_reasoning is None


def test_tool_use_arguments() -> None:
    content = [
        {"type": "tool_use", "id": "toolu_a", "name": "f", "input": {"x": [1, 2]}},
        {"type": "tool_use", "id": "toolu_b", "name": "g", "input": '{"y": 2}'},
        {"type": "tool_use", "id": "toolu_c", "name": "h", "input": '{"y": 2'},
        {"type": "tool_use", "id": 7, "name": None},
        {"type": "tool_result", "tool_use_id": "toolu_a", "content": "ignored"},
        "not a block",
    ]
    assert messages.normalize({"content": content}).tool_calls == (
        ToolCall("toolu_a", "f", {"x": [1, 2]}),
        ToolCall("toolu_b", "g", {"y": 2}),
        ToolCall("toolu_c", "h", {"_raw": '{"y": 2'}),
        ToolCall(None, None, None),
    )


def test_reasoning_content() -> None:
    def reasoning(*blocks: Any) -> str | None:
        return messages.normalize({"content": list(blocks)}).reasoning_content

    assert reasoning({"type": "text", "text": "no thinking"}) is None
    assert reasoning({"type": "redacted_thinking", "data": "abc"}) is None
    assert reasoning({"type": "thinking", "thinking": ""}) is None
    assert reasoning({"type": "thinking", "thinking": 3}, {"type": "thinking"}) is None
    assert reasoning(
        {"type": "thinking", "thinking": "a"}, {"type": "thinking", "thinking": "b"}
    ) == ("a\nb")


@pytest.mark.parametrize(
    "response",
    [
        None,
        [],
        "msg",
        42,
        {},
        {"id": 1, "model": ["m"], "stop_reason": 5, "usage": "lots", "content": "text"},
        {"content": [None, 1, [], {"type": None}], "usage": None},
    ],
)
def test_normalize_never_raises(response: object) -> None:
    normalized = messages.normalize(cast(Any, response))
    assert normalized.response_id is None
    assert normalized.usage == Usage()
    assert normalized.tool_calls == ()


# --- is_terminal_event -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "terminal"),
    [
        (_event(STOP), True),
        (_event(STOP, name=None), True),
        (SSEEvent(data="{}", event="message_stop"), True),
        (_event({"type": "error", "error": {"type": "overloaded_error"}}), True),
        (_event({"type": "error", "error": {"type": "api_error"}}, name=None), True),
        (SSEEvent(data="not json", event="error"), True),
        (_event({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}), False),
        (_event({"type": "content_block_stop", "index": 0}), False),
        (_event({"type": "ping"}), False),
        (SSEEvent(data="[DONE]"), False),
        (SSEEvent(data='"message_stop"'), False),
        # A type spelled with escapes, under another event name, still counts.
        (SSEEvent(data='{"type": "message\\u005fstop"}', event="content_block_delta"), True),
        (SSEEvent(data='{"type": "\\u0065rror", "error": {}}', event="ping"), True),
    ],
)
def test_is_terminal_event(event: SSEEvent, terminal: bool) -> None:
    assert messages.is_terminal_event(event) is terminal


# --- reassembly ------------------------------------------------------------------------------


def test_no_events_is_truncated_without_response() -> None:
    got = _reassemble()
    assert (got.response, got.outcome, got.error) == (None, StreamOutcome.TRUNCATED, None)


def test_garbage_data_is_ignored() -> None:
    garbage = [
        SSEEvent(data="not json", event="message_start"),
        SSEEvent(data="[1, 2]", event="content_block_start"),
        SSEEvent(data='{"type": "content_block_delta", "index": 0, "delta": "x"}'),
        SSEEvent(data='{"type": "message_start", "message": "msg"}'),
        SSEEvent(data=cast(Any, None), event="message_start"),
        SSEEvent(data=""),
    ]
    got = _reassemble(*garbage)
    assert (got.response, got.outcome) == (None, StreamOutcome.TRUNCATED)
    got = _reassemble(_start(), *garbage, STOP)
    assert got.outcome is StreamOutcome.COMPLETED
    assert got.response == _start()["message"]


def test_deltas_for_an_index_never_started_are_dropped() -> None:
    got = _reassemble(
        _start(),
        _delta(3, {"type": "text_delta", "text": "lost"}),
        _delta(True, {"type": "text_delta", "text": "lost"}),
        _block_start(0, {"type": "text", "text": ""}),
        _delta(0, {"type": "text_delta", "text": "kept"}),
        _delta(-1, {"type": "text_delta", "text": "lost"}),
        STOP,
    )
    assert got.response["content"] == [{"type": "text", "text": "kept"}]


def test_input_json_never_closed_but_whole_is_parsed() -> None:
    got = _reassemble(
        _start(), _block_start(0, TOOL), _json_delta(0, ""), _json_delta(0, '{"a": 1}')
    )
    assert got.outcome is StreamOutcome.TRUNCATED
    assert got.response["content"] == [{**TOOL, "input": {"a": 1}}]


def test_input_json_cut_short_keeps_the_text() -> None:
    got = _reassemble(_start(), _block_start(0, TOOL), _json_delta(0, '{"a": '))
    assert got.response["content"] == [{**TOOL, "input": '{"a": '}]
    tool_call = messages.normalize(got.response).tool_calls[0]
    assert tool_call.arguments == {"_raw": '{"a": '}


def test_only_empty_input_json_keeps_the_start_input() -> None:
    block = {**TOOL, "input": {"preset": True}}
    got = _reassemble(
        _start(),
        _block_start(0, block),
        _json_delta(0, ""),
        {"type": "content_block_stop", "index": 0},
        STOP,
    )
    assert got.response["content"] == [block]


def test_blocks_are_ordered_by_index() -> None:
    got = _reassemble(
        _start(),
        _block_start(1, {"type": "text", "text": "b"}),
        _block_start(0, {"type": "text", "text": "a"}),
        _delta(0, {"type": "text_delta", "text": "1"}),
        _delta(1, {"type": "text_delta", "text": "2"}),
        STOP,
    )
    texts = [block["text"] for block in got.response["content"]]
    assert texts == ["a1", "b2"]


def test_repeated_starts_keep_the_first() -> None:
    got = _reassemble(
        _start(id="msg_first"),
        _block_start(0, {"type": "text", "text": ""}),
        _delta(0, {"type": "text_delta", "text": "one"}),
        _start(id="msg_second"),
        _block_start(0, {"type": "thinking", "thinking": ""}),
        _delta(0, {"type": "text_delta", "text": " two"}),
        STOP,
    )
    assert got.response["id"] == "msg_first"
    assert got.response["content"] == [{"type": "text", "text": "one two"}]


def test_unknown_deltas_and_events_never_change_what_the_block_started_with() -> None:
    got = _reassemble(
        _start(),
        _block_start(0, {"type": "text", "text": "a"}),
        _delta(0, {"type": "future_delta", "text": "x"}),
        _delta(0, {"type": "text_delta", "text": 5}),
        _delta(0, {"type": "citations_delta"}),
        {"type": "future_event", "index": 0},
        {"type": "ping"},
        STOP,
    )
    assert got.response["content"] == [{"type": "text", "text": "a"}]


def test_keys_the_sdk_drops_are_kept_on_the_message_or_block_they_are_about() -> None:
    got = _reassemble(
        _start(),
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        _delta(0, {"type": "text_delta", "text": "a", "x_meta": 1}),
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "b"},
            "x_event": "e",
        },
        _block_start(1, {"type": "future_block"}),
        _delta(1, {"type": "future_delta", "body": "ab", "n": 1}),
        _delta(1, {"type": "future_delta", "body": "cd", "n": 2}),
        {"type": "content_block_stop", "index": 1, "x_stop": True},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None, "x_delta": "d"},
            "usage": {"output_tokens": 3, "x_usage": 7},
            "context_management": {"applied_edits": []},
            "x_top": None,
        },
        {"type": "message_stop", "x_end": "z"},
    )
    assert got.response["content"] == [
        {"type": "text", "text": "ab", "x_meta": 1, "x_event": "e"},
        {"type": "future_block", "body": "abcd", "n": 2, "x_stop": True},
    ]
    assert got.response["context_management"] == {"applied_edits": []}
    assert (got.response["x_delta"], got.response["x_end"]) == ("d", "z")
    assert "x_top" not in got.response  # null: not reported
    assert got.response["usage"]["x_usage"] == 7


def test_signature_is_set_and_compaction_replaces_its_content_as_the_sdk_does() -> None:
    got = _reassemble(
        _start(),
        _block_start(0, {"type": "thinking", "thinking": "", "signature": "old"}),
        _delta(0, {"type": "signature_delta", "signature": "new"}),
        _block_start(1, {"type": "compaction", "content": None}),
        _delta(1, {"type": "compaction_delta", "content": "s1", "encrypted_content": "e1"}),
        _delta(1, {"type": "compaction_delta", "content": "s2", "encrypted_content": "e2"}),
        _block_start(2, {"type": "fallback", "to": {"model": "claude-other"}}),
        STOP,
    )
    assert got.response["content"][0]["signature"] == "new"
    assert got.response["content"][1] == {
        "type": "compaction",
        "content": "s2",
        "encrypted_content": "e2",
    }
    assert got.response["model"] == "claude-other"


def test_message_delta_usage_overwrites_except_nulls() -> None:
    got = _reassemble(
        _start(usage={"input_tokens": 10, "cache_read_input_tokens": 4, "output_tokens": 1}),
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None, "content": "ignored"},
            "usage": {"output_tokens": 30, "input_tokens": None, "server_tool_use": {"n": 1}},
        },
        {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 32}},
        STOP,
    )
    assert got.response["stop_reason"] == "end_turn"
    assert got.response["content"] == []
    assert got.response["usage"] == {
        "input_tokens": 10,
        "cache_read_input_tokens": 4,
        "output_tokens": 32,
        "server_tool_use": {"n": 1},
    }


def test_error_before_any_message() -> None:
    error = {"type": "overloaded_error", "message": "Overloaded"}
    got = _reassemble({"type": "error", "error": error})
    assert (got.response, got.outcome, got.error) == (None, StreamOutcome.ERROR, error)


def test_error_event_without_an_error_object() -> None:
    got = _reassemble(_start(), SSEEvent(data="oops", event="error"))
    assert (got.outcome, got.error) == (StreamOutcome.ERROR, None)
    assert got.response == _start()["message"]


def test_events_after_the_terminal_event_are_ignored() -> None:
    got = _reassemble(
        _start(),
        STOP,
        {"type": "error", "error": {"type": "api_error"}},
        _block_start(0, {"type": "text", "text": "late"}),
    )
    assert (got.outcome, got.error) == (StreamOutcome.COMPLETED, None)
    assert got.response["content"] == []


def test_finish_gives_fresh_objects() -> None:
    reassembler = messages.StreamReassembler()
    for payload in (_start(), _block_start(0, {"type": "text", "text": "hi"}), STOP):
        reassembler.feed(_event(payload))
    first = reassembler.finish()
    assert first.response is not None
    first.response["content"][0]["text"] = "changed"
    first.response["usage"]["output_tokens"] = 99
    second = reassembler.finish()
    assert second.response is not None
    assert second.response["content"] == [{"type": "text", "text": "hi"}]
    assert second.response["usage"] == {"input_tokens": 10, "output_tokens": 1}


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
_types = st.sampled_from(
    [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "error",
        "ping",
    ]
)
_deltas = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            [
                "text_delta",
                "thinking_delta",
                "signature_delta",
                "input_json_delta",
                "citations_delta",
            ]
        ),
        "text": _json,
        "thinking": _json,
        "signature": _json,
        "partial_json": _json | st.sampled_from(['{"a"', ": 1}", ""]),
        "citation": _json,
    }
)
_payloads = st.fixed_dictionaries(
    {"type": _types | _json},
    optional={
        "index": st.integers(-1, 3) | _json,
        "message": st.fixed_dictionaries({}, optional={"content": _json, "usage": _json}) | _json,
        "content_block": st.fixed_dictionaries({"type": st.text(max_size=5)}) | _json,
        "delta": _deltas | _json,
        "usage": _json,
        "error": _json,
    },
)
_events = st.builds(
    SSEEvent,
    data=st.one_of(_payloads.map(lambda p: orjson.dumps(p).decode()), st.text(max_size=10)),
    event=st.none() | _types | st.text(max_size=5),
)


@given(st.lists(_events, max_size=12))
def test_reassembly_and_normalize_never_raise(events: list[SSEEvent]) -> None:
    reassembler = messages.StreamReassembler()
    for event in events:
        messages.is_terminal_event(event)
        reassembler.feed(event)
    got = reassembler.finish()
    if got.response is not None:
        messages.normalize(got.response)


def test_size_counts_fragments_kept_and_whole_events_otherwise() -> None:
    reassembler = messages.StreamReassembler()
    start = _event({"type": "message_start", "message": _start()})
    reassembler.feed(start)
    assert reassembler.size == len(start.data) + PIECE_OVERHEAD
    block = _event(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    )
    reassembler.feed(block)
    before = reassembler.size
    for _ in range(10):
        reassembler.feed(
            _event(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": "y" * 500},
                }
            )
        )
    assert reassembler.size - before == 10 * (500 + PIECE_OVERHEAD)
