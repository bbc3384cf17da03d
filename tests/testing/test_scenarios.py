"""The fake upstream's answers, built without a server: shapes, determinism, knobs, failures."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from rollcap.dialects import StreamOutcome, context_length_exceeded, get_dialect, reassemble
from rollcap.testing import expected_response
from rollcap.testing._knobs import DIALECTS
from rollcap.testing._scenarios import ReplyKind, answer, is_authorized
from tests.testing._support import (
    COMPLETING,
    TERMINAL_OUTCOME,
    decode,
    header,
    json_of,
    reply,
    request,
    streamed,
    with_stream_index,
)

# --- the stream and the non-streamed answer agree -------------------------------------------------


@pytest.mark.parametrize("scenario", COMPLETING)
@pytest.mark.parametrize("dialect", DIALECTS)
def test_reassembled_stream_equals_non_streamed_answer(dialect: str, scenario: str) -> None:
    headers = {"x-fake-scenario": scenario}
    whole = reply(dialect, request(dialect), headers)
    stream = streamed(dialect, request(dialect), headers)
    assert whole.status == 200
    assert stream.kind is ReplyKind.STREAM
    assert not stream.cut

    result = reassemble(dialect, stream.events)

    assert result.outcome is TERMINAL_OUTCOME.get((dialect, scenario), StreamOutcome.COMPLETED)
    assert result.response == with_stream_index(json_of(whole))
    # Split anywhere, the bytes still give the same object.
    raw = b"".join(stream.events)
    assert reassemble(dialect, [raw[i : i + 7] for i in range(0, len(raw), 7)]) == result


@pytest.mark.parametrize("dialect", DIALECTS)
def test_expected_response_is_the_non_streamed_answer(dialect: str) -> None:
    body = request(dialect, stream=True)
    headers = {"x-fake-scenario": "tool"}
    assert expected_response(dialect, body, headers) == json_of(
        reply(dialect, request(dialect), headers)
    )


@pytest.mark.parametrize("scenario", ["truncate", "malformed_json", "http_500", "hang"])
def test_expected_response_refuses_failing_scenarios(scenario: str) -> None:
    with pytest.raises(ValueError, match="this request gets"):
        expected_response("chat", request("chat"), {"x-fake-scenario": scenario})


# --- scenario shapes ------------------------------------------------------------------------------


def test_text_answer_shapes() -> None:
    text = "Hello! This is the rollcap fake upstream answering your request."
    responses = json_of(reply("responses", request("responses")))
    assert responses["object"] == "response"
    assert responses["status"] == "completed"
    assert responses["output"][0]["content"][0]["text"] == text
    chat = json_of(reply("chat", request("chat")))
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["content"] == text
    assert chat["choices"][0]["finish_reason"] == "stop"
    messages = json_of(reply("messages", request("messages")))
    assert messages["type"] == "message"
    assert messages["content"] == [{"type": "text", "text": text}]
    assert messages["stop_reason"] == "end_turn"


def test_model_is_echoed_or_defaulted() -> None:
    assert json_of(reply("chat", request("chat", model="my-model")))["model"] == "my-model"
    body = request("chat")
    del body["model"]
    assert json_of(reply("chat", body))["model"] == "fake-model"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_tool_call_uses_the_first_tool_and_its_schema(dialect: str) -> None:
    answer_ = json_of(reply(dialect, request(dialect), {"x-fake-scenario": "tool"}))
    normalized = get_dialect(dialect).normalize(answer_)
    (call,) = normalized.tool_calls
    assert call.name == "get_weather"
    assert call.arguments == {"city": "example city", "unit": "celsius"}
    assert call.call_id
    assert (
        normalized.finish_reason
        == {
            "responses": None,
            "chat": "tool_calls",
            "messages": "tool_use",
        }[dialect]
    )
    if dialect == "responses":
        assert answer_["output"][0]["type"] == "function_call"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_tool_call_without_tools_calls_lookup(dialect: str) -> None:
    body = request(dialect)
    del body["tools"]
    normalized = get_dialect(dialect).normalize(
        json_of(reply(dialect, body, {"x-fake-scenario": "tool"}))
    )
    assert [(c.name, c.arguments) for c in normalized.tool_calls] == [
        ("lookup", {"query": "example query"})
    ]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_tool_arguments_stream_in_several_deltas(dialect: str) -> None:
    kinds = {
        "responses": "response.function_call_arguments.delta",
        "chat": "tool_calls",
        "messages": "input_json_delta",
    }
    events = decode(streamed(dialect, request(dialect), {"x-fake-scenario": "tool"}).events)
    assert sum(kinds[dialect] in event.data for event in events) >= 3


def _with_tool_result(dialect: str, body: dict[str, Any], answer_: dict[str, Any]) -> None:
    """Append the model's tool call and its result to the conversation, in the dialect's shape."""
    (call,) = get_dialect(dialect).normalize(answer_).tool_calls
    output = f"result of {call.name}"
    if dialect == "responses":
        if isinstance(body["input"], str):
            body["input"] = [{"role": "user", "content": body["input"]}]
        body["input"] += [
            *answer_["output"],
            {"type": "function_call_output", "call_id": call.call_id, "output": output},
        ]
    elif dialect == "chat":
        body["messages"] += [
            answer_["choices"][0]["message"],
            {"role": "tool", "tool_call_id": call.call_id, "content": output},
        ]
    else:
        body["messages"] += [
            {"role": "assistant", "content": answer_["content"]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.call_id, "content": output}
                ],
            },
        ]


@pytest.mark.parametrize("turns", [None, 3, 0])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_tool_turns_call_the_tools_in_turn_then_answer(dialect: str, turns: int | None) -> None:
    body = request(dialect)
    second = {"type": "object", "properties": {"zone": {"type": "string"}}}
    if dialect == "responses":
        body["tools"].append({"type": "function", "name": "get_time", "parameters": second})
    elif dialect == "chat":
        body["tools"].append(
            {"type": "function", "function": {"name": "get_time", "parameters": second}}
        )
    else:
        body["tools"].append({"name": "get_time", "input_schema": second})
    headers = {"x-fake-scenario": "tool_turns"}
    if turns is not None:
        headers["x-fake-tool-turns"] = str(turns)
    called: list[tuple[str | None, Any]] = []
    for _ in range(5):
        answer_ = json_of(reply(dialect, body, headers))
        normalized = get_dialect(dialect).normalize(answer_)
        if not normalized.tool_calls:
            break
        called += [(c.name, c.arguments) for c in normalized.tool_calls]
        _with_tool_result(dialect, body, answer_)
    weather = ("get_weather", {"city": "example city", "unit": "celsius"})
    time_ = ("get_time", {"zone": "example zone"})
    assert called == [weather, time_, weather][: 2 if turns is None else turns]
    assert normalized.finish_reason in (None, "stop", "end_turn")
    text = "Hello! This is the rollcap fake upstream answering your request."
    assert text in orjson.dumps(answer_).decode()


@pytest.mark.parametrize("dialect", DIALECTS)
def test_context_length_is_a_400_each_api_words_its_own_way(dialect: str) -> None:
    refused = reply(dialect, request(dialect), {"x-fake-scenario": "context_length"})
    assert refused.status == 400
    body = json_of(refused)
    assert context_length_exceeded(400, body)
    if dialect == "messages":
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["message"].startswith("prompt is too long: ")
    else:
        assert body["error"]["code"] == "context_length_exceeded"
        assert "maximum context length is 4096 tokens" in body["error"]["message"]


def test_reasoning_shapes() -> None:
    headers = {"x-fake-scenario": "reasoning"}
    responses = json_of(reply("responses", request("responses"), headers))
    assert [item["type"] for item in responses["output"]] == ["reasoning", "message"]
    assert responses["output"][0]["summary"][0]["type"] == "summary_text"
    assert responses["usage"]["output_tokens_details"]["reasoning_tokens"] > 0

    chat = json_of(reply("chat", request("chat"), headers))
    assert chat["choices"][0]["message"]["reasoning_content"]
    assert chat["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
    chat_events = decode(streamed("chat", request("chat"), headers).events)
    assert any("reasoning_content" in event.data for event in chat_events)

    messages = json_of(reply("messages", request("messages"), headers))
    thinking, text = messages["content"]
    assert thinking["type"] == "thinking"
    assert thinking["thinking"]
    assert thinking["signature"]
    assert text["type"] == "text"


def test_incomplete_shapes() -> None:
    headers = {"x-fake-scenario": "incomplete"}
    responses = json_of(reply("responses", request("responses"), headers))
    assert responses["status"] == "incomplete"
    assert responses["incomplete_details"] == {"reason": "max_output_tokens"}
    last = decode(streamed("responses", request("responses"), headers).events)[-1]
    assert last.event == "response.incomplete"
    chat = json_of(reply("chat", request("chat"), headers))
    assert chat["choices"][0]["finish_reason"] == "length"
    messages = json_of(reply("messages", request("messages"), headers))
    assert messages["stop_reason"] == "max_tokens"


# --- failure modes --------------------------------------------------------------------------------

OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    429: "requests",
    500: "server_error",
    503: "server_error",
}
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


@pytest.mark.parametrize("status", sorted(OPENAI_TYPES))
@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("stream", [False, True])
def test_http_error_scenarios(dialect: str, status: int, stream: bool) -> None:
    r = reply(dialect, request(dialect, stream=stream), {"x-fake-scenario": f"http_{status}"})
    assert r.kind is ReplyKind.BODY
    assert r.status == status
    assert header(r, "content-type") == "application/json"
    body = json_of(r)
    if dialect == "messages":
        assert body["type"] == "error"
        assert body["error"]["type"] == ANTHROPIC_TYPES[status]
        assert body["error"]["message"]
        assert body["request_id"] == "req_test" == header(r, "request-id")
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["type"] == OPENAI_TYPES[status]
        assert header(r, "x-request-id") == "req_test"


def test_any_http_status_scenario() -> None:
    assert reply("chat", request("chat"), {"x-fake-scenario": "http_418"}).status == 418
    r = reply("messages", request("messages"), {"x-fake-scenario": "http_529"})
    assert r.status == 529
    assert json_of(r)["error"]["type"] == "overloaded_error"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_malformed_json(dialect: str) -> None:
    headers = {"x-fake-scenario": "malformed_json"}
    whole = reply(dialect, request(dialect), headers)
    assert whole.status == 200
    assert header(whole, "content-type") == "application/json"
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(whole.body)

    stream = streamed(dialect, request(dialect), headers)
    bad = [e for e in decode(stream.events) if e.data != "[DONE]" and not _is_json(e.data)]
    assert len(bad) == 1
    # Around the bad line the stream is complete: it is the text answer.
    result = reassemble(dialect, stream.events)
    assert result.outcome is StreamOutcome.COMPLETED
    assert result.response == json_of(reply(dialect, request(dialect)))


def _is_json(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


@pytest.mark.parametrize("dialect", DIALECTS)
def test_truncate(dialect: str) -> None:
    headers = {"x-fake-scenario": "truncate"}
    stream = streamed(dialect, request(dialect), headers)
    assert stream.cut
    result = reassemble(dialect, stream.events)
    assert result.outcome is StreamOutcome.TRUNCATED
    assert not any(get_dialect(dialect).is_terminal_event(e) for e in decode(stream.events))
    assert result.response is not None

    whole = reply(dialect, request(dialect), headers)
    assert whole.cut
    assert whole.declared_length is not None
    assert len(whole.body) < whole.declared_length
    full = reply(dialect, request(dialect)).body
    assert full.startswith(whole.body)
    assert len(full) == whole.declared_length


@pytest.mark.parametrize("dialect", DIALECTS)
def test_stream_error(dialect: str) -> None:
    stream = streamed(dialect, request(dialect), {"x-fake-scenario": "stream_error"})
    assert not stream.cut
    result = reassemble(dialect, stream.events)
    assert result.outcome is StreamOutcome.ERROR
    assert result.error is not None
    events = decode(stream.events)
    if dialect == "responses":
        assert events[-1].event == "error"
        assert orjson.loads(events[-1].data)["code"] == "server_error"
    elif dialect == "chat":
        assert orjson.loads(events[-2].data)["error"]["type"] == "server_error"
        assert events[-1].data == "[DONE]"
    else:
        assert events[-1].event == "error"
        assert orjson.loads(events[-1].data)["error"]["type"] == "overloaded_error"
    # Some text came first.
    assert result.response is not None

    whole = reply(dialect, request(dialect), {"x-fake-scenario": "stream_error"})
    assert whole.status == (529 if dialect == "messages" else 500)


@pytest.mark.parametrize("scenario", ["hang", "disconnect"])
def test_hang_and_disconnect_replies(scenario: str) -> None:
    r = reply("chat", request("chat", stream=True), {"x-fake-scenario": scenario})
    assert r.kind is ReplyKind(scenario)


def test_delays_travel_with_the_reply() -> None:
    headers = {"x-fake-delay-ms": "10", "x-fake-chunk-delay-ms": "2", "x-fake-scenario": "hang"}
    r = reply("chat", request("chat"), headers)
    assert (r.delay_s, r.chunk_delay_s) == (0.01, 0.002)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_stream_headers(dialect: str) -> None:
    r = streamed(dialect, request(dialect))
    assert header(r, "content-type") == "text/event-stream; charset=utf-8"
    assert header(r, "request-id" if dialect == "messages" else "x-request-id") == "req_test"


# --- requests the fake refuses --------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b""])
def test_bad_bodies_get_400(dialect: str, raw: bytes) -> None:
    r = answer(dialect, raw, {}, request_id="req_test")
    assert r.status == 400


def test_unknown_dialect_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown dialect"):
        answer("completions", b"{}", {}, request_id="req_test")


@pytest.mark.parametrize(
    ("dialect", "headers", "ok"),
    [
        ("chat", {"authorization": "Bearer sk-good"}, True),
        ("chat", {"authorization": "bearer sk-good"}, True),
        ("chat", {"authorization": "Bearer sk-bad"}, False),
        ("chat", {"x-api-key": "sk-good"}, False),
        ("chat", {}, False),
        ("responses", {"authorization": "Bearer sk-good"}, True),
        ("messages", {"x-api-key": "sk-good"}, True),
        ("messages", {"authorization": "Bearer sk-good"}, True),
        ("messages", {"x-api-key": "sk-bad"}, False),
        ("messages", {"authorization": "Basic sk-good"}, False),
    ],
)
def test_authorization(dialect: str, headers: dict[str, str], ok: bool) -> None:
    assert is_authorized(dialect, headers, "sk-good") is ok
    r = reply(dialect, request(dialect), headers, api_key="sk-good")
    assert r.status == (200 if ok else 401)
    if not ok:
        body = json_of(r)
        error = body["error"]
        assert error["type"] == (
            "authentication_error" if dialect == "messages" else "invalid_request_error"
        )
        assert b"sk-good" not in r.body
