"""vllm_model: Responses and Messages clients answered by a chat-only upstream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import orjson
import pytest

from rollcap import CaptureStore, read_model_call_records
from rollcap.testing import FakeUpstream, expected_response
from rollcap.translate import messages_request_to_chat, responses_request_to_chat
from tests.server.conftest import CLIENT_KEY, UPSTREAM_KEY, model_server, settings_for
from tests.server.test_sdks import TOOLS_MESSAGES, TOOLS_RESPONSES

SCENARIO = "x-fake-scenario"


@pytest.fixture
async def vllm(upstream: FakeUpstream, tmp_path: Path) -> AsyncIterator[str]:
    settings = settings_for(upstream.url, tmp_path, model_type="vllm_model")
    async with model_server(settings) as url:
        yield url


def _chat_answer(request: dict[str, Any], scenario: str = "text") -> dict[str, Any]:
    """What the fake upstream answers the translated chat request with."""
    return expected_response("chat", request, {SCENARIO: scenario})


async def test_responses_client_through_a_chat_upstream(
    vllm: str, upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with httpx2.AsyncClient() as http:
        client = openai.AsyncOpenAI(
            base_url=f"{vllm}/ng-rollout/v-1/v1",
            api_key=CLIENT_KEY,
            max_retries=0,
            http_client=http,
        )
        plain = await client.responses.create(model="fake-model", input="Which option?")
        async with client.responses.stream(
            model="fake-model", input="Reason, then answer.", extra_headers={SCENARIO: "reasoning"}
        ) as stream:
            reasoned = await stream.get_final_response()
        tool = await client.responses.create(
            model="fake-model",
            input="Pick one.",
            tools=TOOLS_RESPONSES,
            extra_headers={SCENARIO: "tool"},
        )
        async with client.responses.stream(
            model="fake-model",
            input="Pick one.",
            tools=TOOLS_RESPONSES,
            extra_headers={SCENARIO: "tool"},
        ) as stream:
            streamed_tool = await stream.get_final_response()

    assert {r.path for r in upstream.requests} == {"/v1/chat/completions"}
    assert all(r.headers["authorization"] == f"Bearer {UPSTREAM_KEY}" for r in upstream.requests)
    chat = _chat_answer(
        responses_request_to_chat({"model": "fake-model", "input": "Which option?"})
    )
    assert plain.output_text == chat["choices"][0]["message"]["content"]
    assert plain.usage is not None
    assert plain.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert reasoned.output[0].type == "reasoning"
    assert reasoned.output_text
    for answer in (tool, streamed_tool):
        (call,) = [item for item in answer.output if item.type == "function_call"]
        assert call.name == "pick_option"
        assert orjson.loads(call.arguments) == {"letter": "A"}

    calls = read_model_call_records(CaptureStore(tmp_path), "v-1")
    assert [c.dialect for c in calls] == ["responses"] * 4
    assert all(c.error_category is None for c in calls)
    assert calls[0].response_id == plain.id
    assert calls[1].reasoning_content
    assert calls[3].tool_calls[0]["arguments"] == {"letter": "A"}
    assert calls[3].response is not None
    assert calls[3].response["id"] == streamed_tool.id


async def test_messages_client_through_a_chat_upstream(vllm: str, tmp_path: Path) -> None:
    messages: list[Any] = [{"role": "user", "content": "Which option?"}]
    async with httpx2.AsyncClient() as http:
        client = anthropic.AsyncAnthropic(
            base_url=f"{vllm}/ng-rollout/v-2", api_key=CLIENT_KEY, max_retries=0, http_client=http
        )
        plain = await client.messages.create(model="fake-model", max_tokens=256, messages=messages)
        async with client.messages.stream(
            model="fake-model",
            max_tokens=2048,
            messages=messages,
            thinking={"type": "enabled", "budget_tokens": 1024},
            extra_headers={SCENARIO: "reasoning"},
        ) as stream:
            thought = await stream.get_final_message()
        async with client.messages.stream(
            model="fake-model",
            max_tokens=256,
            messages=messages,
            tools=TOOLS_MESSAGES,
            extra_headers={SCENARIO: "tool"},
        ) as stream:
            tool = await stream.get_final_message()

    chat = _chat_answer(
        messages_request_to_chat({"model": "fake-model", "max_tokens": 256, "messages": messages})
    )
    assert plain.content[0].type == "text"
    assert plain.content[0].text == chat["choices"][0]["message"]["content"]
    assert plain.stop_reason == "end_turn"
    assert [b.type for b in thought.content] == ["thinking", "text"]
    assert tool.stop_reason == "tool_use"
    (use,) = [b for b in tool.content if b.type == "tool_use"]
    assert (use.name, use.input) == ("pick_option", {"letter": "A"})

    calls = read_model_call_records(CaptureStore(tmp_path), "v-2")
    assert [c.dialect for c in calls] == ["messages"] * 3
    # Cached tokens are split out of input_tokens, so tokens_in still equals the chat prompt.
    assert calls[0].tokens_in == chat["usage"]["prompt_tokens"]
    assert calls[1].reasoning_content == thought.content[0].thinking  # type: ignore[union-attr]
    assert calls[2].tool_calls == [
        {"call_id": use.id, "name": "pick_option", "arguments": {"letter": "A"}}
    ]


async def test_upstream_errors_reach_each_client_in_its_own_shape(
    vllm: str, tmp_path: Path
) -> None:
    async with httpx2.AsyncClient() as http:
        oai = openai.AsyncOpenAI(
            base_url=f"{vllm}/ng-rollout/e/v1", api_key=CLIENT_KEY, max_retries=0, http_client=http
        )
        ant = anthropic.AsyncAnthropic(
            base_url=f"{vllm}/ng-rollout/e", api_key=CLIENT_KEY, max_retries=0, http_client=http
        )
        with pytest.raises(openai.RateLimitError):
            await oai.responses.create(
                model="fake-model", input="x", extra_headers={SCENARIO: "http_429"}
            )
        with pytest.raises(anthropic.RateLimitError) as info:
            await ant.messages.create(
                model="fake-model",
                max_tokens=16,
                messages=[{"role": "user", "content": "x"}],
                extra_headers={SCENARIO: "http_429"},
            )
        assert info.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError, match="previous_response_id"):
            await oai.responses.create(model="fake-model", input="x", previous_response_id="resp_1")
    categories = [c.error_category for c in read_model_call_records(CaptureStore(tmp_path), "e")]
    assert categories == ["rate_limit", "rate_limit", "client_error"]


async def test_truncated_chat_stream_reaches_the_client_truncated(
    vllm: str, tmp_path: Path
) -> None:
    async with httpx2.AsyncClient() as http:
        client = openai.AsyncOpenAI(
            base_url=f"{vllm}/ng-rollout/cut/v1",
            api_key=CLIENT_KEY,
            max_retries=0,
            http_client=http,
        )
        with pytest.raises((httpx2.RemoteProtocolError, openai.APIError)):
            async with client.responses.stream(
                model="fake-model", input="x", extra_headers={SCENARIO: "truncate"}
            ) as stream:
                await stream.get_final_response()
    (call,) = read_model_call_records(CaptureStore(tmp_path), "cut")
    assert call.error_category == "stream_truncated"


def _execution(call: Any) -> tuple[object, ...]:
    return (
        call.upstream_attempted,
        call.response_source,
        call.upstream_status_code,
        call.local_response_reason,
    )


async def test_each_call_says_how_its_answer_came_about(
    vllm: str, upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with httpx2.AsyncClient() as http:
        oai = openai.AsyncOpenAI(
            base_url=f"{vllm}/ng-rollout/x/v1", api_key=CLIENT_KEY, max_retries=0, http_client=http
        )
        ant = anthropic.AsyncAnthropic(
            base_url=f"{vllm}/ng-rollout/x", api_key=CLIENT_KEY, max_retries=0, http_client=http
        )
        await oai.responses.create(model="fake-model", input="x")
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            await oai.responses.create(
                model="fake-model", input="x", extra_headers={SCENARIO: "context_length"}
            )
        with pytest.raises(anthropic.BadRequestError, match="maximum context length"):
            await ant.messages.create(
                model="fake-model",
                max_tokens=16,
                messages=[{"role": "user", "content": "x"}],
                extra_headers={SCENARIO: "context_length"},
            )
        with pytest.raises(openai.BadRequestError):
            await oai.chat.completions.create(
                model="fake-model",
                messages=[{"role": "user", "content": "x"}],
                extra_headers={SCENARIO: "context_length"},
            )
        # Refused before anything goes upstream: the body is not a JSON object.
        refused = await http.post(f"{vllm}/ng-rollout/x/v1/responses", content=b"[1]")
        assert refused.status_code == 400
    calls = read_model_call_records(CaptureStore(tmp_path), "x")
    assert [(c.dialect, c.error_category) for c in calls] == [
        ("responses", None),
        ("responses", "context_length_exceeded"),
        ("messages", "context_length_exceeded"),
        ("chat", "context_length_exceeded"),
        ("responses", "client_error"),
    ]
    assert [_execution(c) for c in calls] == [
        (True, "upstream", 200, None),
        (True, "upstream", 400, None),
        (True, "upstream", 400, None),
        (True, "upstream", 400, None),
        (False, "local", None, "invalid_request"),
    ]
    assert len(upstream.requests) == 4  # the refused call never went upstream


async def test_an_unreachable_upstream_gets_the_servers_own_answer(tmp_path: Path) -> None:
    async with FakeUpstream() as gone:
        url = gone.url
    settings = settings_for(url, tmp_path, model_type="vllm_model")
    async with model_server(settings) as server, httpx2.AsyncClient() as http:
        base_url = f"{server}/ng-rollout/u/v1"
        oai = openai.AsyncOpenAI(
            base_url=base_url, api_key=CLIENT_KEY, max_retries=0, http_client=http
        )
        with pytest.raises(openai.InternalServerError):
            await oai.responses.create(model="fake-model", input="x")
    (call,) = read_model_call_records(CaptureStore(tmp_path), "u")
    assert call.error_category == "connection"
    assert _execution(call) == (True, "local", None, "upstream_unreachable")
