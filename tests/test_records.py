from __future__ import annotations

from typing import Any

import pytest

from rollcap.records import (
    TRANSPORT_WEBSOCKET,
    ErrorCategory,
    ModelCallRecord,
    RawRecord,
    error_category,
    infer_dialect,
    is_streamed,
    model_ref,
    record_json,
)

# The raw record printed on the spec page, as one persisted line would hold it.
SPEC_RECORD: dict[str, Any] = {
    "model_call_id": "863410a8d52e4be6a31efc5c6e9d4629",
    "dialect": "responses",
    "model_ref": {"type": "responses_api_models", "name": "policy_model"},
    "started_at": 1786032154.12,
    "completed_at": 1786032154.96,
    "latency_ms": 842.7,
    "latency_ttft_ms": 213.4,
    "status_code": 200,
    "error_category": None,
    "request": {
        "model": "gpt-4.1-2025-04-14",
        "input": [{"role": "user", "content": "Which option is correct?"}],
    },
    "response": {
        "id": "resp_123",
        "status": "completed",
        "usage": {"input_tokens": 94, "output_tokens": 28, "total_tokens": 122},
    },
}


def test_spec_record_normalizes_as_the_page_shows() -> None:
    record = ModelCallRecord.from_raw(SPEC_RECORD, 0)
    assert record.tokens_in == 94
    assert record.tokens_out == 28
    assert record.tokens_total == 122
    assert record.latency_total_ms == 842.7
    assert record.latency_ttft_ms == 213.4
    assert record.response_id == "resp_123"
    assert record.response_status == "completed"
    assert record.model == "gpt-4.1-2025-04-14"  # the response names none: the request's
    assert record.model_ref == {"type": "responses_api_models", "name": "policy_model"}
    assert record.tokens_reasoning is None
    assert record.cached_tokens is None
    assert record.cache_hit is None
    assert record.call_index == 0


def test_raw_record_json_has_exactly_the_contract_keys() -> None:
    raw = RawRecord.from_json(SPEC_RECORD)
    assert raw.to_json() == SPEC_RECORD
    assert list(raw.to_json()) == list(SPEC_RECORD)
    extra = RawRecord(
        **{**SPEC_RECORD, "error_category": ErrorCategory.STREAM_TRUNCATED},
        request_raw="x",
        response_raw="event: a\ndata: b\n\n",
        client_session_id="sess-1",
        gaps=[{"code": "g"}],
    ).to_json()
    assert extra["error_category"] == "stream_truncated"
    assert type(extra["error_category"]) is str
    assert set(extra) - set(SPEC_RECORD) == {
        "request_raw",
        "response_raw",
        "client_session_id",
        "gaps",
    }


def test_a_record_written_without_a_raw_record_is_the_raw_record_s_json() -> None:
    optional = {
        "request_raw": "x",
        "response_raw": None,
        "client_session_id": "sess-1",
        "upstream_attempted": False,
        "transport": TRANSPORT_WEBSOCKET,
        "client_events": [{"type": "response.steer"}],
    }
    fields = {
        **SPEC_RECORD,
        "latency_ms": 842.70499,
        "error_category": ErrorCategory.STREAM_TRUNCATED,
        **optional,
    }
    written = record_json(**fields)
    expected = RawRecord(**fields).to_json()
    assert written == expected
    assert list(written) == list(expected)
    assert (written["latency_ms"], written["error_category"]) == (842.7, "stream_truncated")
    assert "response_raw" not in written  # None: not written
    with pytest.raises(TypeError, match="has no rollout_id"):
        record_json(**SPEC_RECORD, rollout_id="0-0")


def test_latencies_are_rounded_to_two_decimals() -> None:
    raw = RawRecord(**{**SPEC_RECORD, "latency_ms": 842.70499, "latency_ttft_ms": 1.005001})
    assert raw.latency_ms == 842.7
    assert raw.latency_ttft_ms == 1.01


def test_reading_foreign_records_is_lenient() -> None:
    foreign = {
        **SPEC_RECORD,
        "error_category": "some_future_category",
        "latency_ms": True,
        "status_code": "200",
        "request": "not an object",
        "unknown_key": {"x": 1},
        "gaps": ["bad", {"code": "ok"}],
    }
    record = ModelCallRecord.from_raw(foreign, 5)
    assert record.error_category == "some_future_category"
    assert record.latency_total_ms is None
    assert record.status_code is None
    assert record.request is None
    assert record.call_index == 5
    assert RawRecord.from_json(foreign).gaps == [{"code": "ok"}]
    assert ModelCallRecord.from_raw({}, 0).dialect == ""


def test_unknown_dialect_keeps_raw_data_without_normalizing() -> None:
    record = ModelCallRecord.from_raw({**SPEC_RECORD, "dialect": "gemini"}, 0)
    assert record.tokens_in is None
    assert record.response == SPEC_RECORD["response"]


def test_cache_hit_and_tool_calls_and_model_from_response() -> None:
    response = {
        "id": "chatcmpl-1",
        "model": "served-model",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"x": 1}'},
                        }
                    ],
                },
            }
        ],
        "usage": {
            "prompt_tokens": 10,
            "completion_tokens": 2,
            "total_tokens": 12,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    }
    raw = {**SPEC_RECORD, "dialect": "chat", "request": {"model": "asked"}, "response": response}
    record = ModelCallRecord.from_raw(raw, 0)
    assert record.model == "served-model"
    assert record.cached_tokens == 4
    assert record.cache_hit is True
    assert record.tokens_in == 10  # OpenAI cached tokens are already inside the input count
    assert record.finish_reason == "tool_calls"
    assert record.tool_calls == [{"call_id": "call_1", "name": "f", "arguments": {"x": 1}}]


def test_cache_hit_follows_a_cached_count_under_any_naming() -> None:
    for usage, cached, hit in (
        ({"input_tokens": 9, "cached_input_tokens": 6}, 6, True),
        ({"input_tokens": 9, "input_tokens_details": {"cached_input_tokens": 0}}, 0, False),
        ({"input_tokens": 9}, None, None),
    ):
        raw = {**SPEC_RECORD, "response": {"id": "resp_1", "usage": usage}}
        record = ModelCallRecord.from_raw(raw, 0)
        assert (record.cached_tokens, record.cache_hit) == (cached, hit), usage


NO_DIALECT = {key: value for key, value in SPEC_RECORD.items() if key != "dialect"}


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (
            {
                "object": "response",
                "status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"},
                "output": [],
                "usage": {"input_tokens": 5, "output_tokens": 1, "reasoning_output_tokens": 1},
            },
            ("max_output_tokens", "incomplete", 5, 1),
        ),
        (
            {
                "object": "chat.completion",
                "choices": [{"finish_reason": "stop", "message": {"content": "hi"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1},
            },
            ("stop", None, 3, None),
        ),
        (
            {
                "type": "message",
                "content": [{"type": "text", "text": "hi"}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 2, "cache_read_input_tokens": 4, "output_tokens": 1},
            },
            ("end_turn", None, 6, None),
        ),
    ],
)
def test_a_record_without_a_dialect_is_read_by_its_response_s_shape(
    response: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    record = ModelCallRecord.from_raw({**NO_DIALECT, "response": response}, 0)
    got = (record.finish_reason, record.response_status, record.tokens_in, record.tokens_reasoning)
    assert got == expected
    assert record.dialect == ""  # what the record says: nothing is made up for it


@pytest.mark.parametrize(
    ("response", "dialect"),
    [
        ({"output": [], "choices": []}, "responses"),  # NeMo Gym's reader tries output first
        ({"choices": [], "content": []}, "chat"),
        ({"content": []}, "messages"),
        ({"object": "response", "output": None}, "responses"),
        ({"object": "chat.completion.chunk"}, "chat"),
        ({"type": "message", "content": "text"}, "messages"),
        ({"id": "x", "status": "completed"}, None),
        ({"object": "list", "type": "other"}, None),
        ([], None),
        (None, None),
    ],
)
def test_infer_dialect_by_the_answer_list_then_the_object_type(
    response: object, dialect: str | None
) -> None:
    assert infer_dialect(response) == dialect


# EVIDENCE.md section 3.3, in order.
DUMP_ORDER = [
    "model_call_id",
    "response_id",
    "client_session_id",
    "call_index",
    "model_ref",
    "model",
    "dialect",
    "status_code",
    "response_status",
    "finish_reason",
    "upstream_attempted",
    "response_source",
    "upstream_status_code",
    "local_response_reason",
    "started_at",
    "completed_at",
    "tokens_in",
    "tokens_out",
    "tokens_reasoning",
    "tokens_total",
    "request",
    "response",
    "request_raw",
    "response_raw",
    "tool_calls",
    "reasoning_content",
    "cache_hit",
    "cached_tokens",
    "cache_creation_tokens",
    "error_category",
    "latency_total_ms",
    "latency_ttft_ms",
]


def test_to_dict_field_order_and_payload_drop() -> None:
    record = ModelCallRecord.from_raw(SPEC_RECORD, 0)
    full = record.to_dict()
    assert list(full) == DUMP_ORDER
    slim = record.to_dict(payloads=False)
    assert list(slim) == [
        k for k in DUMP_ORDER if k not in ("request", "response", "request_raw", "response_raw")
    ]
    # Unknown values are null, never absent or made up.
    assert full["client_session_id"] is None
    assert full["upstream_attempted"] is None
    assert full["response_source"] is None
    assert full["upstream_status_code"] is None
    assert full["local_response_reason"] is None


def test_execution_fields_are_copied_from_the_raw_record() -> None:
    local = {
        **SPEC_RECORD,
        "upstream_attempted": False,
        "response_source": "local",
        "upstream_status_code": None,
        "local_response_reason": "context_length_exceeded",
        "client_session_id": "inv-1",
    }
    record = ModelCallRecord.from_raw(local, 3).to_dict()
    assert record["upstream_attempted"] is False
    assert record["response_source"] == "local"
    assert record["upstream_status_code"] is None
    assert record["local_response_reason"] == "context_length_exceeded"
    assert record["client_session_id"] == "inv-1"
    upstream = {
        **SPEC_RECORD,
        "upstream_attempted": True,
        "response_source": "upstream",
        "upstream_status_code": 200,
    }
    record = ModelCallRecord.from_raw(upstream, 0).to_dict()
    assert (record["upstream_attempted"], record["response_source"]) == (True, "upstream")
    assert record["upstream_status_code"] == 200
    # Mistyped values are unknown: a bool is no status, a source outside the two is none.
    odd = {
        **SPEC_RECORD,
        "upstream_attempted": "yes",
        "response_source": "cache",
        "upstream_status_code": True,
        "local_response_reason": 7,
        "client_session_id": 42,
    }
    record = ModelCallRecord.from_raw(odd, 0).to_dict()
    assert [record[k] for k in ("upstream_attempted", "response_source")] == [None, None]
    assert [record[k] for k in ("upstream_status_code", "local_response_reason")] == [None, None]
    assert record["client_session_id"] is None


def test_raw_record_writes_execution_fields_only_when_known() -> None:
    raw = RawRecord(**SPEC_RECORD, upstream_attempted=True, response_source="upstream")
    out = raw.to_json()
    assert out["upstream_attempted"] is True
    assert out["response_source"] == "upstream"
    assert "upstream_status_code" not in out
    assert "local_response_reason" not in out
    assert RawRecord.from_json(out) == raw


def test_a_websocket_turn_says_so_and_keeps_its_other_client_events() -> None:
    steer = {"type": "response.steer", "input": []}
    raw = RawRecord(**SPEC_RECORD, transport=TRANSPORT_WEBSOCKET, client_events=[steer])
    out = raw.to_json()
    assert (out["transport"], out["client_events"]) == ("websocket", [steer])
    assert RawRecord.from_json(out) == raw
    # An HTTP call's record has neither key; a foreign value is read leniently.
    assert "transport" not in RawRecord(**SPEC_RECORD).to_json()
    lenient = RawRecord.from_json({**out, "transport": 3, "client_events": [steer, "x"]})
    assert (lenient.transport, lenient.client_events) == (None, [steer])


@pytest.mark.parametrize(
    "value",
    [
        None,
        {},
        {"type": "resources_servers", "name": "x"},
        {"type": "responses_api_models"},
        {"type": "responses_api_models", "name": 3},
        "policy_model",
    ],
)
def test_model_ref_is_null_when_unknown(value: object) -> None:
    raw = {**SPEC_RECORD, "model_ref": value}
    assert ModelCallRecord.from_raw(raw, 0).model_ref is None


def test_model_ref_keeps_only_type_and_name() -> None:
    raw = {**SPEC_RECORD, "model_ref": {"name": "p", "type": "responses_api_models", "x": 1}}
    assert ModelCallRecord.from_raw(raw, 0).to_dict()["model_ref"] == {
        "type": "responses_api_models",
        "name": "p",
    }


@pytest.mark.parametrize(
    ("status", "flags", "expected"),
    [
        (200, {}, None),
        (408, {}, "timeout"),
        (504, {"parse_failed": True}, "timeout"),
        (429, {}, "rate_limit"),
        (401, {}, "auth"),
        (403, {}, "auth"),
        (404, {}, "not_found"),
        (400, {}, "client_error"),
        (422, {"stream_error": True}, "client_error"),
        (500, {}, "upstream_error"),
        (503, {}, "upstream_error"),
        (200, {"stream_error": True, "truncated": True}, "upstream_error"),
        (200, {"incomplete": True}, "incomplete"),
        (200, {"truncated": True, "cancelled": True}, "stream_truncated"),
        (200, {"cancelled": True}, "cancelled"),
        (None, {"connection_failed": True}, "connection"),
        (None, {"timed_out": True}, "timeout"),
        (200, {"parse_failed": True}, "capture_parse_error"),
        (400, {"context_length_exceeded": True}, "context_length_exceeded"),
        (None, {"context_length_exceeded": True, "timed_out": True}, "context_length_exceeded"),
        (None, {}, None),
    ],
)
def test_error_category_first_rule_that_applies(
    status: int | None, flags: dict[str, bool], expected: str | None
) -> None:
    assert error_category(status, **flags) == expected


def test_model_ref() -> None:
    assert model_ref("policy_model") == {"type": "responses_api_models", "name": "policy_model"}


def test_a_gap_dumps_without_nulls_for_capture_and_whole_for_evidence() -> None:
    from rollcap.records import Gap

    assert Gap("c").to_dict() == {"code": "c"}
    assert Gap("c", "d").to_dict() == {"code": "c", "detail": "d"}
    assert list(Gap("c", "d", "inv").to_dict()) == ["code", "invocation_id", "detail"]
    assert Gap("c").dump() == {"code": "c", "invocation_id": None, "detail": None}
    assert list(Gap("c", "d", "inv").dump().items()) == [
        ("code", "c"),
        ("invocation_id", "inv"),
        ("detail", "d"),
    ]


def test_a_call_is_streamed_when_it_asked_or_came_over_a_websocket() -> None:
    assert is_streamed({"stream": True}, None)
    assert not is_streamed({"stream": False}, None)
    assert not is_streamed(None, None)
    # A WebSocket turn's request has no stream key: every answer on a socket is a stream.
    assert is_streamed({"model": "m"}, TRANSPORT_WEBSOCKET)
    assert is_streamed(None, "websocket")
