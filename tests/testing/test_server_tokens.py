"""Token ids through the official OpenAI SDK against the running fake, turn after turn.

A client that sends each answer back as it received it sees every prompt start with the previous
prompt plus the ids generated for that answer: the property RL token staging relies on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion

from rollcap.testing import (
    PREFIX_IDS_FIELD,
    FakeUpstream,
    assistant_body,
    decode,
    encode,
    fake_logprob,
    render_prompt,
)

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "metric": {"type": "boolean"}},
    "required": ["city", "metric"],
}
TOOLS: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
TOKENS = {"return_token_ids": True, "logprobs": True}
# A bound against hanging, far above what any call here needs.
TIMEOUT = 10.0


@pytest.fixture
async def oai(upstream: FakeUpstream) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(
        base_url=upstream.url + "/v1", api_key="sk-test", max_retries=0, timeout=TIMEOUT
    )
    yield client
    await client.close()


async def create(
    oai: openai.AsyncOpenAI, messages: list[dict[str, Any]], scenario: str, **extra: Any
) -> ChatCompletion:
    sent: Any = messages
    return await oai.chat.completions.create(
        model="gpt-test",
        messages=sent,
        tools=TOOLS,
        extra_headers={"x-fake-scenario": scenario},
        extra_body={**TOKENS, **extra},
    )


def prompt_ids(completion: ChatCompletion) -> list[int]:
    ids = (completion.model_extra or {})["prompt_token_ids"]
    assert isinstance(ids, list)
    return ids


def generated_ids(completion: ChatCompletion) -> list[int]:
    ids = (completion.choices[0].model_extra or {})["token_ids"]
    assert isinstance(ids, list)
    return ids


def check_answer(completion: ChatCompletion, sent: list[dict[str, Any]]) -> dict[str, Any]:
    """The checks every turn passes; returns the answer as the client sends it back."""
    choice = completion.choices[0]
    message = choice.message.model_dump(mode="json")  # keeps "content": null
    prompt, generated = prompt_ids(completion), generated_ids(completion)

    assert prompt == render_prompt(sent)
    assert generated[-1] == 2
    assert decode(generated) == assistant_body(message)
    assert generated == [*encode(assistant_body(message)), 2]
    if choice.message.tool_calls:
        assert choice.message.content is None
    else:
        assert decode(generated) == choice.message.content
    assert choice.logprobs is not None
    assert choice.logprobs.content is not None
    entries = choice.logprobs.content
    assert len(entries) == len(generated)
    for position, (entry, token_id) in enumerate(zip(entries, generated, strict=True)):
        assert entry.logprob == fake_logprob(token_id, position)
        assert entry.logprob == -((token_id + position) % 64) / 16
        assert entry.top_logprobs == []
    assert "".join(e.token for e in entries[:-1]) == decode(generated)  # ASCII answers
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == len(prompt)
    assert completion.usage.completion_tokens == len(generated)
    assert completion.usage.total_tokens == len(prompt) + len(generated)
    return message


async def test_prefix_property_over_a_tool_conversation(oai: openai.AsyncOpenAI) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a weather assistant."},
        {"role": "user", "content": "Weather in Paris and in Lyon? Then a haiku about it."},
    ]
    previous: tuple[list[int], list[int]] | None = None
    for turn, scenario in enumerate(["tool", "tool", "text", "tool", "reasoning", "text"]):
        completion = await create(oai, messages, scenario)
        prompt, generated = prompt_ids(completion), generated_ids(completion)
        if previous is not None:
            before = previous[0] + previous[1]
            assert prompt[: len(before)] == before, f"turn {turn} does not extend turn {turn - 1}"
            assert len(prompt) > len(before)
        previous = (prompt, generated)

        answer = check_answer(completion, messages)
        messages.append(answer)
        if answer["tool_calls"]:
            assert completion.choices[0].finish_reason == "tool_calls"
            (call,) = answer["tool_calls"]
            assert decode(generated).startswith("<tool_call>get_weather\n")
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21C"})
        else:
            # The user answers with content parts.
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Thanks! "},
                        {"type": "text", "text": "Now Lyon."},
                    ],
                }
            )


async def test_pinned_prefix(oai: openai.AsyncOpenAI) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    first = await create(oai, messages, "tool")
    pinned = prompt_ids(first) + generated_ids(first)
    answer = first.choices[0].message.model_dump(mode="json")
    call_id = answer["tool_calls"][0]["id"]
    tail: list[dict[str, Any]] = [{"role": "tool", "tool_call_id": call_id, "content": "sunny"}]
    messages += [answer, *tail]

    second = await create(oai, messages, "text", **{PREFIX_IDS_FIELD: pinned})
    assert prompt_ids(second) == pinned + render_prompt(tail)
    assert second.usage is not None
    assert second.usage.prompt_tokens == len(pinned) + len(render_prompt(tail))
    # The pinned ids stand for everything up to the answer's end id; an unpinned prompt also
    # has the newline that follows that id.
    unpinned = await create(oai, messages, "text")
    assert prompt_ids(unpinned) == pinned + encode("\n") + render_prompt(tail)
    # Bad pins are refused.
    with pytest.raises(openai.BadRequestError, match=PREFIX_IDS_FIELD):
        await create(oai, messages, "text", **{PREFIX_IDS_FIELD: ["x"]})


async def test_tokens_as_token_ids(oai: openai.AsyncOpenAI) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Hi"}]
    completion = await create(oai, messages, "text", return_tokens_as_token_ids=True)
    generated = generated_ids(completion)
    assert completion.choices[0].logprobs is not None
    entries = completion.choices[0].logprobs.content or []
    assert [e.token for e in entries] == [f"token_id:{t}" for t in generated]
    assert [e.bytes for e in entries[:-1]] == [[t - 3] for t in generated[:-1]]


async def test_streamed_token_ids(oai: openai.AsyncOpenAI) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    for scenario in ("text", "tool"):
        whole = await create(oai, messages, scenario)
        sent: Any = messages
        stream = await oai.chat.completions.create(
            model="gpt-test",
            messages=sent,
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"x-fake-scenario": scenario},
            extra_body=TOKENS,
        )
        chunks = [chunk async for chunk in stream]
        assert (chunks[0].model_extra or {})["prompt_token_ids"] == prompt_ids(whole)
        ids: list[int] = []
        logprobs: list[float] = []
        for chunk in chunks:
            for choice in chunk.choices:
                ids += (choice.model_extra or {})["token_ids"]
                if choice.logprobs is not None and choice.logprobs.content:
                    logprobs += [e.logprob for e in choice.logprobs.content]
        assert ids == generated_ids(whole)
        assert logprobs == [fake_logprob(t, i) for i, t in enumerate(ids)]
        assert chunks[-1].usage == whole.usage


async def test_answers_without_token_fields_are_unchanged(oai: openai.AsyncOpenAI) -> None:
    messages: Any = [{"role": "user", "content": "Hi"}]
    plain = await oai.chat.completions.create(model="gpt-test", messages=messages, logprobs=True)
    assert not plain.model_extra
    assert not plain.choices[0].model_extra
    assert plain.choices[0].logprobs is None
    assert plain.usage is not None
    assert plain.usage.prompt_tokens == 1  # ceil(2 characters / 4)
