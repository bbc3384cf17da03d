"""The official SDKs as clients of the fake upstream, over a real socket.

Whatever the fake sends, the SDKs must parse as they parse the real APIs: text, tool calls,
reasoning and usage come out right, and each failure raises the SDK's own error class.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import openai
import pytest

from rollcap.testing import FakeUpstream

TEXT = "Hello! This is the rollcap fake upstream answering your request."
PROMPT = "What is the capital of France? Answer in one short sentence, please."
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "metric": {"type": "boolean"}},
    "required": ["city", "metric"],
    "additionalProperties": False,
}
ARGUMENTS = {"city": "example city", "metric": True}
RESPONSES_TOOLS: Any = [
    {"type": "function", "name": "get_weather", "parameters": SCHEMA, "strict": True}
]
CHAT_TOOLS: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
ANTHROPIC_TOOLS: Any = [{"name": "get_weather", "input_schema": SCHEMA}]
MESSAGES: Any = [{"role": "user", "content": PROMPT}]
# A bound against hanging, far above what any call here needs.
TIMEOUT = 10.0


@pytest.fixture
async def oai(upstream: FakeUpstream) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(
        base_url=upstream.url + "/v1", api_key="sk-test", max_retries=0, timeout=TIMEOUT
    )
    yield client
    await client.close()


@pytest.fixture
async def claude(upstream: FakeUpstream) -> AsyncIterator[anthropic.AsyncAnthropic]:
    client = anthropic.AsyncAnthropic(
        base_url=upstream.url, api_key="sk-ant-test", max_retries=0, timeout=TIMEOUT
    )
    yield client
    await client.close()


@pytest.fixture(scope="module")
def threaded() -> Iterator[FakeUpstream]:
    with FakeUpstream.running_in_thread() as server:
        yield server


@pytest.fixture
def oai_sync(threaded: FakeUpstream) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=threaded.url + "/v1", api_key="sk-test", max_retries=0, timeout=TIMEOUT
    ) as client:
        yield client


@pytest.fixture
def claude_sync(threaded: FakeUpstream) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(
        base_url=threaded.url, api_key="sk-ant-test", max_retries=0, timeout=TIMEOUT
    ) as client:
        yield client


# --- OpenAI Responses -----------------------------------------------------------------------------


async def test_responses_create(oai: openai.AsyncOpenAI) -> None:
    response = await oai.responses.create(model="gpt-test", input=PROMPT)
    assert response.output_text == TEXT
    assert response.status == "completed"
    assert response.usage is not None
    assert response.usage.input_tokens == 17
    assert response.usage.input_tokens_details.cached_tokens == 8
    assert response.usage.total_tokens == 17 + response.usage.output_tokens


async def test_responses_create_stream(oai: openai.AsyncOpenAI) -> None:
    stream = await oai.responses.create(model="gpt-test", input=PROMPT, stream=True)
    deltas: list[str] = []
    final: Any = None
    async for event in stream:
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type == "response.completed":
            final = event.response
    assert "".join(deltas) == TEXT
    assert final is not None
    assert final.output_text == TEXT


async def test_responses_stream_helper(oai: openai.AsyncOpenAI) -> None:
    plain = await oai.responses.create(model="gpt-test", input=PROMPT)
    async with oai.responses.stream(model="gpt-test", input=PROMPT) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_response()
    assert final.output_text == TEXT
    assert final.id == plain.id


async def test_responses_tool_call(oai: openai.AsyncOpenAI) -> None:
    response = await oai.responses.create(model="tool", input=PROMPT, tools=RESPONSES_TOOLS)
    (call,) = response.output
    assert call.type == "function_call"
    assert call.name == "get_weather"
    async with oai.responses.stream(model="tool", input=PROMPT, tools=RESPONSES_TOOLS) as stream:
        final = await stream.get_final_response()
    (streamed,) = final.output
    assert streamed.type == "function_call"
    assert streamed.parsed_arguments == ARGUMENTS
    assert streamed.call_id == call.call_id


async def test_responses_reasoning(oai: openai.AsyncOpenAI) -> None:
    async with oai.responses.stream(model="reasoning", input=PROMPT) as stream:
        final = await stream.get_final_response()
    reasoning, _message = final.output
    assert reasoning.type == "reasoning"
    assert reasoning.summary[0].text
    assert final.output_text == TEXT
    assert final.usage is not None
    assert final.usage.output_tokens_details.reasoning_tokens > 0


async def test_responses_stream_error_event(oai: openai.AsyncOpenAI) -> None:
    stream = await oai.responses.create(model="stream_error", input=PROMPT, stream=True)
    kinds = [event.type async for event in stream]
    assert kinds[-1] == "error"
    assert "response.completed" not in kinds


async def test_responses_incomplete(oai: openai.AsyncOpenAI) -> None:
    response = await oai.responses.create(model="incomplete", input=PROMPT)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"


def test_responses_sync(oai_sync: openai.OpenAI) -> None:
    assert oai_sync.responses.create(model="gpt-test", input=PROMPT).output_text == TEXT
    events = list(oai_sync.responses.create(model="gpt-test", input=PROMPT, stream=True))
    assert events[-1].type == "response.completed"
    with oai_sync.responses.stream(model="reasoning", input=PROMPT) as stream:
        assert stream.get_final_response().output_text == TEXT


# --- OpenAI Chat Completions ----------------------------------------------------------------------


async def test_chat_create(oai: openai.AsyncOpenAI) -> None:
    completion = await oai.chat.completions.create(model="gpt-test", messages=MESSAGES)
    assert completion.choices[0].message.content == TEXT
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == 17
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 8


async def test_chat_stream_with_usage(oai: openai.AsyncOpenAI) -> None:
    stream = await oai.chat.completions.create(
        model="gpt-test",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == TEXT
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == 17


async def test_chat_tool_call(oai: openai.AsyncOpenAI) -> None:
    completion = await oai.chat.completions.create(
        model="tool", messages=MESSAGES, tools=CHAT_TOOLS
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    (call,) = choice.message.tool_calls
    assert call.type == "function"
    assert call.function.name == "get_weather"

    stream = await oai.chat.completions.create(
        model="tool", messages=MESSAGES, tools=CHAT_TOOLS, stream=True
    )
    fragments = [
        fragment
        async for chunk in stream
        for fragment in (chunk.choices[0].delta.tool_calls or [] if chunk.choices else [])
    ]
    assert len(fragments) >= 3
    assert fragments[0].id == call.id
    assert "".join(f.function.arguments or "" for f in fragments if f.function) == (
        call.function.arguments
    )


async def test_chat_stream_helper_with_reasoning(oai: openai.AsyncOpenAI) -> None:
    async with oai.chat.completions.stream(
        model="reasoning", messages=MESSAGES, stream_options={"include_usage": True}
    ) as stream:
        completion = await stream.get_final_completion()
    message = completion.choices[0].message
    assert message.content == TEXT
    assert getattr(message, "reasoning_content", None)
    assert completion.usage is not None
    assert completion.usage.completion_tokens_details is not None
    reasoning_tokens = completion.usage.completion_tokens_details.reasoning_tokens
    assert reasoning_tokens is not None
    assert reasoning_tokens > 0


async def test_chat_stream_error_raises(oai: openai.AsyncOpenAI) -> None:
    stream = await oai.chat.completions.create(model="stream_error", messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError, match="server had an error"):
        async for _ in stream:
            pass


def test_chat_sync(oai_sync: openai.OpenAI) -> None:
    completion = oai_sync.chat.completions.create(model="tool", messages=MESSAGES, tools=CHAT_TOOLS)
    assert completion.choices[0].finish_reason == "tool_calls"
    stream = oai_sync.chat.completions.create(
        model="gpt-test", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == TEXT


# --- Anthropic Messages ---------------------------------------------------------------------------


async def test_messages_create(claude: anthropic.AsyncAnthropic) -> None:
    message = await claude.messages.create(model="claude-test", max_tokens=256, messages=MESSAGES)
    assert message.content[0].type == "text"
    assert message.content[0].text == TEXT
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens == 9
    assert message.usage.cache_read_input_tokens == 8


async def test_messages_stream_helper(claude: anthropic.AsyncAnthropic) -> None:
    plain = await claude.messages.create(model="claude-test", max_tokens=256, messages=MESSAGES)
    async with claude.messages.stream(
        model="claude-test", max_tokens=256, messages=MESSAGES
    ) as stream:
        texts = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(texts) == TEXT
    assert final.id == plain.id
    assert final.usage.output_tokens == plain.usage.output_tokens


async def test_messages_tool_use(claude: anthropic.AsyncAnthropic) -> None:
    message = await claude.messages.create(
        model="tool", max_tokens=256, messages=MESSAGES, tools=ANTHROPIC_TOOLS
    )
    assert message.stop_reason == "tool_use"
    (block,) = message.content
    assert block.type == "tool_use"
    assert (block.name, block.input) == ("get_weather", ARGUMENTS)
    async with claude.messages.stream(
        model="tool", max_tokens=256, messages=MESSAGES, tools=ANTHROPIC_TOOLS
    ) as stream:
        final = await stream.get_final_message()
    (streamed,) = final.content
    assert streamed.type == "tool_use"
    assert streamed.input == ARGUMENTS


async def test_messages_thinking(claude: anthropic.AsyncAnthropic) -> None:
    async with claude.messages.stream(
        model="reasoning",
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=MESSAGES,
    ) as stream:
        final = await stream.get_final_message()
    thinking, text = final.content
    assert thinking.type == "thinking"
    assert thinking.thinking
    assert thinking.signature
    assert text.type == "text"
    assert text.text == TEXT


async def test_messages_stream_error_raises(claude: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(anthropic.APIStatusError, match="overloaded_error"):
        async with claude.messages.stream(
            model="stream_error", max_tokens=256, messages=MESSAGES
        ) as stream:
            await stream.get_final_message()


async def test_messages_max_tokens(claude: anthropic.AsyncAnthropic) -> None:
    message = await claude.messages.create(model="incomplete", max_tokens=256, messages=MESSAGES)
    assert message.stop_reason == "max_tokens"


def test_messages_sync(claude_sync: anthropic.Anthropic) -> None:
    message = claude_sync.messages.create(model="claude-test", max_tokens=256, messages=MESSAGES)
    assert message.content[0].type == "text"
    with claude_sync.messages.stream(model="tool", max_tokens=256, messages=MESSAGES) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "tool_use"
    assert final.content[0].name == "lookup"


# --- failures -------------------------------------------------------------------------------------

OPENAI_ERRORS = {
    "http_400": openai.BadRequestError,
    "http_401": openai.AuthenticationError,
    "http_404": openai.NotFoundError,
    "http_429": openai.RateLimitError,
    "http_500": openai.InternalServerError,
    "http_503": openai.InternalServerError,
}
ANTHROPIC_ERRORS = {
    "http_400": anthropic.BadRequestError,
    "http_401": anthropic.AuthenticationError,
    "http_404": anthropic.NotFoundError,
    "http_429": anthropic.RateLimitError,
    "http_500": anthropic.InternalServerError,
    "http_503": anthropic.InternalServerError,
}


@pytest.mark.parametrize("scenario", sorted(OPENAI_ERRORS))
async def test_openai_error_classes(oai: openai.AsyncOpenAI, scenario: str) -> None:
    headers = {"x-fake-scenario": scenario}
    with pytest.raises(OPENAI_ERRORS[scenario]) as raised:
        await oai.responses.create(model="gpt-test", input=PROMPT, extra_headers=headers)
    assert raised.value.status_code == int(scenario[5:])
    assert raised.value.request_id is not None
    with pytest.raises(OPENAI_ERRORS[scenario]):
        await oai.chat.completions.create(
            model="gpt-test", messages=MESSAGES, stream=True, extra_headers=headers
        )


@pytest.mark.parametrize("scenario", sorted(ANTHROPIC_ERRORS))
async def test_anthropic_error_classes(claude: anthropic.AsyncAnthropic, scenario: str) -> None:
    headers = {"x-fake-scenario": scenario}
    with pytest.raises(ANTHROPIC_ERRORS[scenario]) as raised:
        await claude.messages.create(
            model="claude-test", max_tokens=256, messages=MESSAGES, extra_headers=headers
        )
    assert isinstance(raised.value, anthropic.APIStatusError)
    assert raised.value.status_code == int(scenario[5:])
    assert raised.value.request_id is not None


async def test_timeouts_and_disconnects(
    oai: openai.AsyncOpenAI, claude: anthropic.AsyncAnthropic
) -> None:
    with pytest.raises(openai.APITimeoutError):
        await oai.chat.completions.create(model="hang", messages=MESSAGES, timeout=0.2)
    with pytest.raises(anthropic.APITimeoutError):
        await claude.messages.create(model="hang", max_tokens=256, messages=MESSAGES, timeout=0.2)
    with pytest.raises(openai.APIConnectionError):
        await oai.responses.create(model="disconnect", input=PROMPT)
    with pytest.raises(anthropic.APIConnectionError):
        await claude.messages.create(model="disconnect", max_tokens=256, messages=MESSAGES)


async def test_sdk_api_keys() -> None:
    async with FakeUpstream(api_key="sk-right") as server:
        for key, ok in (("sk-right", True), ("sk-wrong", False)):
            oai = openai.AsyncOpenAI(
                base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=TIMEOUT
            )
            claude = anthropic.AsyncAnthropic(
                base_url=server.url, api_key=key, max_retries=0, timeout=TIMEOUT
            )
            try:
                if ok:
                    await oai.responses.create(model="gpt-test", input=PROMPT)
                    await claude.messages.create(
                        model="claude-test", max_tokens=256, messages=MESSAGES
                    )
                    models = [m.id async for m in oai.models.list()]
                    assert models[0] == "fake-model"
                else:
                    with pytest.raises(openai.AuthenticationError):
                        await oai.responses.create(model="gpt-test", input=PROMPT)
                    with pytest.raises(anthropic.AuthenticationError):
                        await claude.messages.create(
                            model="claude-test", max_tokens=256, messages=MESSAGES
                        )
            finally:
                await oai.close()
                await claude.close()
