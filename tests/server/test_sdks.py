"""The official SDKs through rollcap get what they get from the upstream directly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai

from rollcap import CaptureStore, read_model_call_records
from rollcap._runtime.serving import serving_in_thread
from rollcap.server import create_model_app
from rollcap.testing import FakeUpstream
from tests.server.conftest import CLIENT_KEY, UPSTREAM_KEY, Stack, settings_for

TOOLS_CHAT: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "pick_option",
            "description": "Pick an answer option",
            "parameters": {
                "type": "object",
                "properties": {"letter": {"type": "string", "enum": ["A", "B", "C"]}},
                "required": ["letter"],
            },
        },
    }
]
TOOLS_RESPONSES: list[Any] = [{"type": "function", **TOOLS_CHAT[0]["function"]}]
TOOLS_MESSAGES: list[Any] = [
    {
        "name": "pick_option",
        "description": "Pick an answer option",
        "input_schema": TOOLS_CHAT[0]["function"]["parameters"],
    }
]
SCENARIO = "x-fake-scenario"


def _dump(value: Any) -> Any:
    return value.model_dump(mode="json")


async def _openai_calls(client: openai.AsyncOpenAI) -> list[Any]:
    out: list[Any] = []
    out.append(_dump(await client.responses.create(model="fake-model", input="Which option?")))
    out.append(
        _dump(
            await client.responses.create(
                model="fake-model",
                input="Which option?",
                tools=TOOLS_RESPONSES,
                extra_headers={SCENARIO: "tool"},
            )
        )
    )
    events = await client.responses.create(model="fake-model", input="Think.", stream=True)
    out.append([_dump(e) async for e in events])
    async with client.responses.stream(
        model="fake-model", input="Reason first.", extra_headers={SCENARIO: "reasoning"}
    ) as stream:
        out.append(_dump(await stream.get_final_response()))
    out.append(
        _dump(
            await client.chat.completions.create(
                model="fake-model",
                messages=[{"role": "user", "content": "Which option?"}],
                tools=TOOLS_CHAT,
                extra_headers={SCENARIO: "tool"},
            )
        )
    )
    chunks = await client.chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "Which option?"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={SCENARIO: "reasoning"},
    )
    out.append([_dump(c) async for c in chunks])
    chunks = await client.chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "Which option?"}],
        tools=TOOLS_CHAT,
        stream=True,
        extra_headers={SCENARIO: "tool"},
    )
    out.append([_dump(c) async for c in chunks])
    return out


async def _anthropic_calls(client: anthropic.AsyncAnthropic) -> list[Any]:
    out: list[Any] = []
    messages: list[Any] = [{"role": "user", "content": "Which option?"}]
    out.append(
        _dump(await client.messages.create(model="fake-model", max_tokens=256, messages=messages))
    )
    out.append(
        _dump(
            await client.messages.create(
                model="fake-model",
                max_tokens=256,
                messages=messages,
                tools=TOOLS_MESSAGES,
                extra_headers={SCENARIO: "tool"},
            )
        )
    )
    async with client.messages.stream(
        model="fake-model",
        max_tokens=2048,
        messages=messages,
        thinking={"type": "enabled", "budget_tokens": 1024},
        extra_headers={SCENARIO: "reasoning"},
    ) as stream:
        out.append(_dump(await stream.get_final_message()))
    async with client.messages.stream(
        model="fake-model",
        max_tokens=256,
        messages=messages,
        tools=TOOLS_MESSAGES,
        extra_headers={SCENARIO: "tool"},
    ) as stream:
        out.append(_dump(await stream.get_final_message()))
    return out


async def test_async_sdks_through_rollcap_equal_direct(stack: Stack) -> None:
    async with httpx2.AsyncClient() as http:
        via = openai.AsyncOpenAI(
            base_url=f"{stack.openai_url}/ng-rollout/sdk-oa/v1",
            api_key=CLIENT_KEY,
            max_retries=0,
            http_client=http,
        )
        direct = openai.AsyncOpenAI(
            base_url=f"{stack.upstream.url}/v1",
            api_key=UPSTREAM_KEY,
            max_retries=0,
            http_client=http,
        )
        assert await _openai_calls(via) == await _openai_calls(direct)
        via_a = anthropic.AsyncAnthropic(
            base_url=f"{stack.anthropic_url}/ng-rollout/sdk-an",
            api_key=CLIENT_KEY,
            max_retries=0,
            http_client=http,
        )
        direct_a = anthropic.AsyncAnthropic(
            base_url=stack.upstream.url, api_key=UPSTREAM_KEY, max_retries=0, http_client=http
        )
        anthropic_results = await _anthropic_calls(via_a)
        assert anthropic_results == await _anthropic_calls(direct_a)

    calls = read_model_call_records(stack.store, "sdk-oa")
    assert [c.dialect for c in calls] == ["responses"] * 4 + ["chat"] * 3
    assert all(c.error_category is None and c.status_code == 200 for c in calls)
    assert calls[1].tool_calls[0]["name"] == "pick_option"
    assert calls[3].reasoning_content
    assert calls[4].tool_calls[0]["arguments"] == {"letter": "A"}
    assert calls[5].reasoning_content
    assert calls[6].tool_calls[0]["name"] == "pick_option"

    calls = read_model_call_records(stack.store, "sdk-an")
    assert [c.dialect for c in calls] == ["messages"] * 4
    final = anthropic_results[2]
    assert calls[2].tokens_out == final["usage"]["output_tokens"]
    assert calls[2].reasoning_content == final["content"][0]["thinking"]
    assert calls[3].tool_calls[0]["call_id"] == anthropic_results[3]["content"][-1]["id"]


def test_sync_sdks_through_rollcap(tmp_path: Path) -> None:
    with FakeUpstream.running_in_thread(api_key=UPSTREAM_KEY) as upstream:
        app = create_model_app(settings_for(upstream.url, tmp_path))
        with serving_in_thread(app) as url, httpx2.Client() as http:
            client = openai.OpenAI(
                base_url=f"{url}/ng-rollout/sync-1/v1",
                api_key=CLIENT_KEY,
                max_retries=0,
                http_client=http,
            )
            response = client.responses.create(model="fake-model", input="Which option?")
            with client.responses.stream(model="fake-model", input="Which option?") as stream:
                streamed = stream.get_final_response()
            completion = client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "Which option?"}]
            )
            chunks = list(
                client.chat.completions.create(
                    model="fake-model",
                    messages=[{"role": "user", "content": "Which option?"}],
                    stream=True,
                )
            )
    assert response.output_text == streamed.output_text
    assert completion.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "stop"
    calls = read_model_call_records(CaptureStore(tmp_path), "sync-1")
    assert [c.dialect for c in calls] == ["responses", "responses", "chat", "chat"]
    assert calls[0].tokens_in == response.usage.input_tokens if response.usage else False
    assert calls[1].response_id == streamed.id
