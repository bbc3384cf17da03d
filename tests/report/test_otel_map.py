"""The pure mapping: ids, the trace's shape, attributes as mapped, gaps, content modes, chunks."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path
from typing import Any

import orjson
import pytest

import rollcap.report
from rollcap.records import Gap, RawRecord
from rollcap.report._otel_map import (
    ContentMode,
    ExportOptions,
    RolloutInfo,
    SpanData,
    call_span_id,
    chunked,
    estimated_size,
    rollout_spans,
    root_span_id,
    trace_id,
)
from rollcap.testing import expected_response

KEY = "6f1c1d3e-3f49-4a8e-9d0b-2b8c0f7a5e11"
OPTIONS = ExportOptions(KEY)
T0 = 1_732_406_400.25  # 2024-11-24, well in the past
TOOLS = [{"type": "function", "function": {"name": "pick", "parameters": {"type": "object"}}}]


def record(
    dialect: str,
    request: dict[str, Any],
    *,
    call_id: str,
    start: float,
    scenario: str = "text",
    ttft_ms: float | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A raw record as the capturing model server writes it for a completed call."""
    if "response" in fields:
        response = fields.pop("response")
    else:
        response = expected_response(dialect, request, {"x-fake-scenario": scenario})
    values: dict[str, Any] = {
        "model_call_id": call_id,
        "dialect": dialect,
        "model_ref": {"type": "responses_api_models", "name": "policy_model"},
        "started_at": start,
        "completed_at": start + 0.5,
        "latency_ms": 500.0,
        "latency_ttft_ms": ttft_ms,
        "status_code": 200,
        "error_category": None,
        "request": request,
        "response": response,
    }
    values.update(fields)
    return RawRecord(**values).to_json()


def chat_request(**extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "Pick"}], **extra}


def spans_of(records: list[dict[str, Any]], **kwargs: Any) -> list[SpanData]:
    options = kwargs.pop("options", OPTIONS)
    return rollout_spans("3-1", list(enumerate(records)), options, **kwargs)


def test_ids_are_derived_from_the_run_key_and_the_ids() -> None:
    assert trace_id(KEY, "3-1") == trace_id(KEY, "3-1")
    assert trace_id(KEY, "3-1") != trace_id(KEY, "3-1-a1")
    assert trace_id(KEY, "3-1") != trace_id("another-run", "3-1")
    assert 0 < trace_id(KEY, "3-1") < 2**128
    assert 0 < call_span_id(KEY, "3-1", "abc") < 2**64
    assert root_span_id(KEY, "3-1") != call_span_id(KEY, "3-1", "abc")
    # The design's rule, byte for byte: sha256(run_key US rollout_id), first 16 bytes.
    digest = hashlib.sha256(f"{KEY}\x1f3-1".encode()).digest()
    assert trace_id(KEY, "3-1") == int.from_bytes(digest[:16], "big")


def test_one_root_and_one_child_per_call_in_file_order() -> None:
    records = [
        record("chat", chat_request(), call_id="a" * 32, start=T0),
        record("chat", chat_request(), call_id="b" * 32, start=T0 + 2),
    ]
    root, first, second = spans_of(records)
    assert (root.kind, root.name, root.parent_span_id) == ("internal", "invoke_agent rollout", None)
    assert root.span_id == root_span_id(KEY, "3-1")
    for span in (first, second):
        assert span.kind == "client"
        assert span.name == "chat fake-model"
        assert span.trace_id == root.trace_id == trace_id(KEY, "3-1")
        assert span.parent_span_id == root.span_id
    assert first.span_id == call_span_id(KEY, "3-1", "a" * 32)
    assert [first.attributes["rollcap.call_index"], second.attributes["rollcap.call_index"]] == [
        0,
        1,
    ]
    assert (first.start_ns, first.end_ns) == (round(T0 * 1e9), round((T0 + 0.5) * 1e9))
    assert (root.start_ns, root.end_ns) == (first.start_ns, second.end_ns)
    assert root.attributes["rollcap.num_calls"] == 2
    assert spans_of(records) == [root, first, second]  # the same again


def test_attributes_as_mapped_with_their_types() -> None:
    request = chat_request(
        temperature=0.7, top_p=1, max_completion_tokens=64, seed=7, stop="END", stream=True
    )
    request["stream_options"] = {"include_usage": True}
    raw = record("chat", request, call_id="c" * 32, start=T0, ttft_ms=123.45, scenario="reasoning")
    raw["client_session_id"] = "sess-1"
    _, span = spans_of([raw])
    a = span.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "openai"
    assert a["openai.api.type"] == "chat_completions"
    assert a["gen_ai.conversation.id"] == "3-1"
    assert a["gen_ai.request.model"] == "fake-model"
    assert a["gen_ai.request.stream"] is True
    assert a["gen_ai.request.temperature"] == 0.7
    assert a["gen_ai.request.top_p"] == 1.0
    assert isinstance(a["gen_ai.request.top_p"], float)
    assert a["gen_ai.request.max_tokens"] == 64
    assert a["gen_ai.request.seed"] == 7
    assert a["gen_ai.request.stop_sequences"] == ["END"]
    response = raw["response"]
    assert a["gen_ai.response.id"] == response["id"]
    assert a["gen_ai.response.model"] == response["model"]
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    usage = response["usage"]
    assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert (
        a["gen_ai.usage.cache_read.input_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
    )
    assert (
        a["gen_ai.usage.reasoning.output_tokens"]
        == (usage["completion_tokens_details"]["reasoning_tokens"])
    )
    assert a["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.12345)
    assert a["http.response.status_code"] == 200
    assert a["rollcap.model_call_id"] == "c" * 32
    assert a["rollcap.client_session_id"] == "sess-1"
    assert a["rollcap.model_ref.name"] == "policy_model"
    assert a["rollcap.tool_call.names"] == []
    assert not span.error
    assert "error.type" not in a


def test_anthropic_and_responses_calls() -> None:
    messages_request = {
        "model": "claude-x",
        "max_tokens": 256,
        "top_k": 5,
        "stop_sequences": ["###"],
        "messages": [{"role": "user", "content": "Pick"}],
        "tools": [{"name": "pick", "input_schema": {"type": "object"}}],
    }
    responses_request = {"model": "fake-model", "input": "Pick", "max_output_tokens": 32}
    _, anthropic, openai = spans_of(
        [
            record("messages", messages_request, call_id="d" * 32, start=T0, scenario="tool"),
            record("responses", responses_request, call_id="e" * 32, start=T0 + 1),
        ]
    )
    a = anthropic.attributes
    assert a["gen_ai.provider.name"] == "anthropic"
    assert "openai.api.type" not in a
    assert a["gen_ai.request.max_tokens"] == 256
    assert a["gen_ai.request.top_k"] == 5.0
    assert a["gen_ai.request.stop_sequences"] == ["###"]
    assert a["gen_ai.request.stream"] is False
    assert a["gen_ai.response.finish_reasons"] == ["tool_use"]
    assert a["rollcap.tool_call.names"] == ["pick"]
    assert "gen_ai.usage.cache_read.input_tokens" in a
    assert anthropic.name == "chat claude-x"
    o = openai.attributes
    assert o["openai.api.type"] == "responses"
    assert o["gen_ai.request.max_tokens"] == 32
    assert "gen_ai.response.finish_reasons" not in o  # a completed Responses call reports none


def test_unknown_stays_absent_never_zero() -> None:
    error_body = {"error": {"type": "rate_limit_error", "message": "slow down"}}
    failed = record(
        "chat",
        chat_request(),
        call_id="f" * 32,
        start=T0,
        response=error_body,
        status_code=429,
        error_category="rate_limit",
    )
    # Not streamed: the proxy's first byte is the whole answer, no time to first chunk.
    no_usage = record("chat", chat_request(), call_id="0" * 32, start=T0 + 1, ttft_ms=480.0)
    del no_usage["response"]["usage"]
    unreachable = record(
        "chat",
        chat_request(),
        call_id="1" * 32,
        start=T0 + 2,
        status_code=None,
        error_category="connection",
        response=None,
    )
    _, rate_limited, counted_nothing, lost = spans_of([failed, no_usage, unreachable])

    assert rate_limited.error
    assert rate_limited.attributes["error.type"] == "rate_limit"
    assert rate_limited.attributes["http.response.status_code"] == 429
    for span in (rate_limited, counted_nothing, lost):
        assert not [k for k in span.attributes if k.startswith("gen_ai.usage.")], span.attributes
    assert "gen_ai.response.finish_reasons" not in rate_limited.attributes
    assert "gen_ai.response.id" not in rate_limited.attributes
    assert lost.attributes["error.type"] == "connection"
    assert "http.response.status_code" not in lost.attributes
    assert "rollcap.tool_call.names" not in lost.attributes  # no answer: unknown
    assert "gen_ai.response.time_to_first_chunk" not in counted_nothing.attributes


def test_an_error_status_without_a_category_still_gets_one() -> None:
    other = record("chat", chat_request(), call_id="2" * 32, start=T0, status_code=503)
    _, span = spans_of([other])
    assert span.error
    assert span.attributes["error.type"] == "upstream_error"


def test_gaps_become_events_without_setting_error() -> None:
    raw = record("chat", chat_request(), call_id="3" * 32, start=T0)
    raw["gaps"] = [{"code": "token_capture_failed", "detail": "no ids"}, {"bad": 1}]
    root, span = spans_of([raw], gaps=[Gap("model_call_capture_incomplete")])
    assert not span.error
    [event] = span.events
    assert event.name == "rollcap.gap"
    assert event.attributes == {"code": "token_capture_failed", "detail": "no ids"}
    assert event.time_ns == span.end_ns
    assert [e.attributes for e in root.events] == [{"code": "model_call_capture_incomplete"}]
    assert not root.error


def test_rollout_line_and_failure_line_fill_the_root() -> None:
    line = {
        "question": "2+2?",
        "_ng_task_index": 3,
        "_ng_rollout_index": 1,
        "_ng_attempt_index": 0,
        "rollout_id": "3-1",
        "response": {},
        "reward": 1,
        "agent_ref": {"type": "responses_api_agents", "name": "mcqa_simple_agent"},
    }
    info = RolloutInfo.from_line(line)
    assert info is not None
    raw = record("chat", chat_request(), call_id="4" * 32, start=T0)
    root, _ = spans_of([raw], info=info)
    assert root.name == "invoke_agent mcqa_simple_agent"
    a = root.attributes
    assert a["gen_ai.operation.name"] == "invoke_agent"
    assert a["gen_ai.agent.name"] == "mcqa_simple_agent"
    assert (a["rollcap.task_index"], a["rollcap.rollout_index"], a["rollcap.attempt_index"]) == (
        3,
        1,
        0,
    )
    assert a["rollcap.reward"] == 1.0
    assert isinstance(a["rollcap.reward"], float)
    assert not root.error

    failure = {"rollout_id": "3-1", "error": {"kind": "agent_http_error", "message": "500 " * 400}}
    failed_info = RolloutInfo.from_line(failure)
    root, _ = spans_of([raw], info=failed_info)
    assert root.error
    assert root.attributes["error.type"] == "agent_http_error"
    assert "rollcap.reward" not in root.attributes
    assert root.status_description is not None
    assert len(root.status_description) <= 1024
    assert RolloutInfo.from_line({"reward": 1}) is None


def test_content_is_absent_unless_asked_for() -> None:
    request = chat_request(tools=TOOLS)
    raw = record("chat", request, call_id="5" * 32, start=T0, scenario="tool")
    content_keys = {
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.tool.definitions",
        "gen_ai.system_instructions",
    }
    _, plain = spans_of([raw])
    assert not content_keys & plain.attributes.keys()
    assert not [k for k in plain.attributes if k.startswith("rollcap.capture")]

    full = ExportOptions(KEY, ContentMode.FULL)
    _, span = spans_of([raw], options=full)
    inputs = orjson.loads(str(span.attributes["gen_ai.input.messages"]))
    assert inputs == [{"role": "user", "parts": [{"type": "text", "content": "Pick"}]}]
    outputs = orjson.loads(str(span.attributes["gen_ai.output.messages"]))
    assert outputs[0]["parts"][-1]["type"] == "tool_call"
    assert orjson.loads(str(span.attributes["gen_ai.tool.definitions"]))[0]["name"] == "pick"
    assert "gen_ai.system_instructions" not in span.attributes  # chat: none apart
    assert "rollcap.content_truncated" not in span.attributes

    ref = ExportOptions(KEY, ContentMode.REF)
    _, _, second = spans_of(
        [raw, raw | {"model_call_id": "6" * 32}], options=ref, capture_file="/c/3-1.capture.jsonl"
    )
    assert second.attributes["rollcap.capture.file"] == "/c/3-1.capture.jsonl"
    assert second.attributes["rollcap.capture.line"] == 2
    assert not content_keys & second.attributes.keys()


def test_content_is_capped_per_attribute() -> None:
    long = chat_request()
    long["messages"] = [{"role": "user", "content": f"message {i} " + "x" * 200} for i in range(20)]
    raw = record("chat", long, call_id="7" * 32, start=T0)
    _, span = spans_of([raw], options=ExportOptions(KEY, ContentMode.FULL, max_content_bytes=1000))
    text = str(span.attributes["gen_ai.input.messages"])
    assert len(text.encode()) <= 1000
    kept = orjson.loads(text)
    assert kept[-1]["parts"][0]["content"].startswith("message 19 ")
    assert span.attributes["rollcap.content_truncated"] is True


def test_calls_without_ids_or_times_are_still_placed() -> None:
    timed = record("chat", chat_request(), call_id="8" * 32, start=T0)
    untimed = record("chat", chat_request(), call_id="", start=0.0, completed_at=0.0)
    twin = dict(timed)
    root, first, second, third = spans_of([timed, untimed, twin])
    assert len({root.span_id, first.span_id, second.span_id, third.span_id}) == 4
    assert second.attributes["rollcap.timing_unknown"] is True
    assert (second.start_ns, second.end_ns) == (root.start_ns, root.start_ns)
    assert "rollcap.model_call_id" not in second.attributes
    assert spans_of([untimed]) == []  # nothing to place it by


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="run key"):
        ExportOptions("")
    with pytest.raises(ValueError, match="at least 1"):
        ExportOptions(KEY, max_content_bytes=0)


def test_chunks_are_bounded_by_count_and_by_size() -> None:
    raws = [record("chat", chat_request(), call_id=f"{i:032x}", start=T0 + i) for i in range(9)]
    spans = spans_of(raws)
    assert [len(c) for c in chunked(spans, max_spans=4)] == [4, 4, 2]
    size = estimated_size(spans[1])
    by_size = list(chunked(spans[1:], max_spans=512, max_bytes=size * 3))
    assert [len(c) for c in by_size] == [3, 3, 3]
    # A span larger than the byte budget still goes, alone.
    assert [len(c) for c in chunked(spans[1:3], max_bytes=1)] == [1, 1]
    assert [s for c in chunked(spans, max_spans=2) for s in c] == spans


def test_mapping_modules_are_pure() -> None:
    # No SDK, no I/O, no clock, no randomness: the mapping must give the same spans every time.
    package = Path(rollcap.report.__file__).parent
    banned = ("opentelemetry", "time", "datetime", "random", "os", "aiohttp", "rollcap.store")
    for name in ("_otel_map.py", "_otel_content.py"):
        tree = ast.parse((package / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            for module in modules:
                assert not any(module == b or module.startswith(b + ".") for b in banned), (
                    name,
                    module,
                )
