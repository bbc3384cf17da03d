"""The official SDKs' stream parsers accept translated and rendered streams (no network)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import orjson
import pytest
from openai.types.responses import NamespaceTool, Response

from rollcap.dialects import reassemble
from rollcap.translate import render_sse
from tests.translate._support import (
    CHAT_FIXTURES,
    FIXTURES,
    NAMESPACED_REQUEST,
    Answer,
    anthropic_client,
    decode,
    encode,
    expected_messages,
    expected_responses,
    openai_client,
    to_messages,
    to_responses,
)

ANSWERS = {
    "reasoning_text_tools": Answer(
        reasoning=["Need", " the weather."],
        content=["Checking ", "now."],
        tools=[
            ("call_a", "weather", ['{"city": ', '"Paris"}']),
            ("call_b", "weather", ['{"city": "Tokyo"}']),
        ],
        finish_reason="tool_calls",
        usage={
            "prompt_tokens": 50,
            "completion_tokens": 20,
            "total_tokens": 70,
            "prompt_tokens_details": {"cached_tokens": 32},
            "completion_tokens_details": {"reasoning_tokens": 8},
        },
    ),
    "text_only": Answer(
        content=["Hello", " there!"], usage={"prompt_tokens": 3, "completion_tokens": 2}
    ),
    "stop_sequence": Answer(content=["1 2 3"], stop_reason="END"),
}
COMPLETE_FIXTURES = [
    p for p in CHAT_FIXTURES if reassemble("chat", [p.read_bytes()]).outcome.value == "completed"
]


def _upstreams() -> list[Any]:
    cases = [pytest.param(answer.chunks(), id=name) for name, answer in ANSWERS.items()]
    cases += [pytest.param(decode(p.read_bytes()), id=p.stem) for p in COMPLETE_FIXTURES]
    return cases


def _check_openai_response(final: Any, expected: dict[str, Any]) -> None:
    assert final.id == expected["id"]
    assert final.status == expected["status"]
    texts = [
        part["text"]
        for item in expected["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    ]
    assert final.output_text == "".join(texts)
    calls = [(o.call_id, o.name, o.arguments) for o in final.output if o.type == "function_call"]
    assert calls == [
        (i["call_id"], i["name"], i["arguments"])
        for i in expected["output"]
        if i["type"] == "function_call"
    ]
    assert [o.type for o in final.output] == [i["type"] for i in expected["output"]]
    if expected["usage"] is None:
        assert final.usage is None
    else:
        assert final.usage.input_tokens == expected["usage"]["input_tokens"]
        assert final.usage.output_tokens == expected["usage"]["output_tokens"]
        assert (
            final.usage.input_tokens_details.cached_tokens
            == (expected["usage"]["input_tokens_details"]["cached_tokens"])
        )


def _check_anthropic_message(final: Any, expected: dict[str, Any]) -> None:
    assert final.model_dump(exclude_none=True, include=set(expected)) == {
        key: value for key, value in expected.items() if value is not None
    }


def _openai_stream(body: bytes) -> Any:
    client = openai_client(body)
    with client.responses.stream(model="policy", input="hi") as stream:
        events = list(stream)
        return events, stream.get_final_response() if events[
            -1
        ].type == "response.completed" else None


def _anthropic_final(body: bytes) -> Any:
    client = anthropic_client(body)
    with client.messages.stream(
        model="policy", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        return stream.get_final_message()


@pytest.mark.parametrize("upstream", _upstreams())
def test_openai_sdk_accepts_translated_responses_stream(upstream: Any) -> None:
    expected = expected_responses(upstream)
    events, final = _openai_stream(encode(to_responses(upstream)))
    if expected["status"] == "completed":
        _check_openai_response(final, expected)
    else:
        assert events[-1].type == "response.incomplete"
        _check_openai_response(events[-1].response, expected)


@pytest.mark.parametrize("upstream", _upstreams())
def test_anthropic_sdk_accepts_translated_messages_stream(upstream: Any) -> None:
    expected = expected_messages(upstream)
    _check_anthropic_message(_anthropic_final(encode(to_messages(upstream))), expected)


@pytest.mark.parametrize("upstream", _upstreams())
def test_sdks_accept_rendered_streams(upstream: Any) -> None:
    response = expected_responses(upstream)
    events, final = _openai_stream(encode(render_sse("responses", response)))
    _check_openai_response(final if final is not None else events[-1].response, response)
    message = expected_messages(upstream)
    _check_anthropic_message(_anthropic_final(encode(render_sse("messages", message))), message)
    chat = reassemble("chat", [encode(upstream)]).response
    assert chat is not None
    client = openai_client(encode(render_sse("chat", chat)))
    chunks = list(
        client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    )
    first = chat["choices"][0]["message"]
    content = "".join(
        c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == 0
    )
    assert content == (first["content"] or "")
    calls = []
    for c in chunks:
        if not c.choices or c.choices[0].index != 0:
            continue
        for call in c.choices[0].delta.tool_calls or ():
            assert call.function is not None
            calls.append((call.id, call.function.name, call.function.arguments))

    assert calls == [
        (call["id"], call["function"]["name"], call["function"]["arguments"])
        for call in first.get("tool_calls", [])
    ]
    usage = [c.usage for c in chunks if c.usage is not None]
    if "usage" in chat:
        assert usage[-1].prompt_tokens == chat["usage"]["prompt_tokens"]
    if all(choice["finish_reason"] != "length" for choice in chat["choices"]):
        # The SDK's accumulator refuses a length-cut answer by design; others rebuild whole.
        with openai_client(encode(render_sse("chat", chat))).chat.completions.stream(
            model="policy", messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            completion = stream.get_final_completion()
        assert completion.choices[0].message.content == first["content"]
        assert completion.choices[0].finish_reason == chat["choices"][0]["finish_reason"]


def _without_parsed(value: Any) -> Any:
    """The SDK's parsing helpers add ``parsed`` / ``parsed_arguments``; the wire has neither."""
    if isinstance(value, list):
        return [_without_parsed(item) for item in value]
    if isinstance(value, dict):
        return {
            key: _without_parsed(item)
            for key, item in value.items()
            if key not in ("parsed", "parsed_arguments")
        }
    return value


def _golden(dialect: str) -> list[Path]:
    # Only complete answers are replayed, and the SDK's final response needs one.
    return [
        path
        for path in sorted((FIXTURES / dialect).glob("*.expected.json"))
        if orjson.loads(path.read_bytes())["outcome"] == "completed"
    ]


@pytest.mark.parametrize("path", _golden("responses"), ids=lambda p: p.stem)
def test_openai_sdk_accepts_rendered_golden_responses(path: Path) -> None:
    response = orjson.loads(path.read_bytes())["response"]
    _events, final = _openai_stream(encode(render_sse("responses", response)))
    assert _without_parsed(final.model_dump(exclude_unset=True)["output"]) == response["output"]


@pytest.mark.parametrize("path", _golden("messages"), ids=lambda p: p.stem)
def test_anthropic_sdk_accepts_rendered_golden_messages(path: Path) -> None:
    message = orjson.loads(path.read_bytes())["response"]
    final = _anthropic_final(encode(render_sse("messages", message)))
    assert final.model_dump(exclude_unset=True)["content"] == message["content"]
    assert final.stop_reason == message["stop_reason"]


def test_sdk_errors_on_translated_error_streams() -> None:
    raw = next(p for p in CHAT_FIXTURES if p.stem == "error_midstream").read_bytes()
    with pytest.raises(anthropic.APIStatusError, match="engine died"):
        _anthropic_final(encode(to_messages(decode(raw))))
    events, final = _openai_stream(encode(to_responses(decode(raw))))
    assert final is None
    assert events[-1].type == "error"
    assert "engine died" in events[-1].message


def test_sdk_sees_truncated_streams_as_unfinished() -> None:
    raw = next(p for p in CHAT_FIXTURES if p.stem == "truncated_after_finish").read_bytes()
    client = openai_client(encode(to_responses(decode(raw))))
    with (
        client.responses.stream(model="policy", input="hi") as stream,
        pytest.raises(RuntimeError, match=r"response\.completed"),
    ):
        stream.get_final_response()
    client_a = anthropic_client(encode(to_messages(decode(raw))))
    with client_a.messages.stream(
        model="policy", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as stream_a:
        stream_a.until_done()
        assert stream_a.current_message_snapshot.stop_reason is None


def test_openai_sdk_reads_namespaced_calls() -> None:
    answer = Answer(
        tools=[("call_1", "crm__lookup", ['{"email": "a@b.c"}']), ("call_2", "weather", ["{}"])],
        finish_reason="tool_calls",
    )
    expected = expected_responses(answer.chunks(), NAMESPACED_REQUEST)
    parsed = Response.model_validate(expected)
    assert isinstance(parsed.tools[1], NamespaceTool)
    calls = [(o.name, o.namespace) for o in parsed.output if o.type == "function_call"]
    assert calls == [("lookup", "crm"), ("weather", None)]
    for body in (
        encode(to_responses(answer.chunks(), NAMESPACED_REQUEST)),
        encode(render_sse("responses", expected)),
    ):
        events, final = _openai_stream(body)
        added = [e.item for e in events if e.type == "response.output_item.added"]
        assert [(i.name, i.namespace) for i in added if i.type == "function_call"] == calls
        assert (
            _without_parsed(final.model_dump(exclude_unset=True)["output"]) == (expected["output"])
        )
