"""The embedded chat server alone, over a real socket."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx2
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from rollcap.local import MODEL_ID, LocalEngine, parse_chat_request

# A long answer, cut short.
QUESTION: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name three colours."}]
ENDS = [{"role": "user", "content": "Say hello."}]  # a short answer the model ends itself
SHORT = 24  # tokens: enough text to compare, little time on a CPU
# Room for ENDS's answer to end by itself: its length moves with the CPU's arithmetic (26
# tokens on a CPU without AVX-512, fewer on the one the test was written on).
ROOM = 64


def _chat(url: str, body: dict[str, Any]) -> httpx2.Response:
    with httpx2.Client(timeout=60) as http:
        return http.post(f"{url}/v1/chat/completions", json=body)


def _events(response: httpx2.Response) -> list[Any]:
    """The SSE data fields, parsed; ``[DONE]`` kept as text."""
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in response.text.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames)
    return [f[6:] if f[6:] == "[DONE]" else orjson.loads(f[6:]) for f in frames]


def _llama_cpp_answer(engine: LocalEngine, messages: list[Any], max_tokens: int) -> Any:
    """What llama-cpp-python's own chat completion gives for the same request, from the state
    every generation of the server starts from: an empty context."""
    call = parse_chat_request({"messages": messages})
    with engine.lock:
        engine.llama.reset()
        return engine.llama.create_chat_completion(
            messages=[dict(m) for m in call.messages],
            temperature=0.0,
            max_tokens=max_tokens,
            seed=0,
        )


@pytest.mark.parametrize(
    ("messages", "max_tokens", "finish"), [(QUESTION, SHORT, "length"), (ENDS, ROOM, "stop")]
)
def test_answer_and_usage_are_llama_cpps(
    chat_url: str, engine: LocalEngine, messages: list[Any], max_tokens: int, finish: str
) -> None:
    body = {"model": "whatever", "messages": messages, "max_tokens": max_tokens}
    response = _chat(chat_url, body)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == MODEL_ID
    (choice,) = body["choices"]
    reference = _llama_cpp_answer(engine, messages, max_tokens)
    assert choice["message"]["content"]
    assert choice["message"]["content"] == reference["choices"][0]["message"]["content"]
    assert choice["finish_reason"] == reference["choices"][0]["finish_reason"] == finish
    assert body["usage"] == reference["usage"]


def test_stream_is_the_same_answer_in_pieces(chat_url: str) -> None:
    request = {"messages": QUESTION, "max_tokens": SHORT}
    whole = _chat(chat_url, request).json()
    events = _events(
        _chat(chat_url, {**request, "stream": True, "stream_options": {"include_usage": True}})
    )
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    deltas = [c for c in chunks if c["choices"]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in deltas)
    assert len(deltas) > 3  # streamed as generated, not in one piece
    assert text == whole["choices"][0]["message"]["content"]
    assert deltas[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert all(c["usage"] is None for c in deltas)
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == whole["usage"]

    plain = _events(_chat(chat_url, {**request, "stream": True}))
    assert plain[-1] == "[DONE]"
    assert all("usage" not in c for c in plain[:-1])


def test_a_stop_string_ends_the_answer_before_it(chat_url: str) -> None:
    request = {"messages": QUESTION, "max_tokens": SHORT}
    text = _chat(chat_url, request).json()["choices"][0]["message"]["content"]
    stop = text.split()[1]  # a word inside the answer: greedy decoding reaches it again
    expected = text[: text.index(stop)]
    body = _chat(chat_url, {**request, "stop": [stop]}).json()
    assert body["choices"][0]["message"]["content"] == expected
    assert body["choices"][0]["finish_reason"] == "stop"
    events = _events(_chat(chat_url, {**request, "stop": stop, "stream": True}))
    streamed = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in events[:-1] if c["choices"]
    )
    assert streamed == expected


def test_max_tokens_and_seeded_sampling(chat_url: str) -> None:
    short = _chat(chat_url, {"messages": QUESTION, "max_tokens": 3}).json()
    assert short["usage"]["completion_tokens"] == 3
    assert short["choices"][0]["finish_reason"] == "length"
    sampled = {"messages": QUESTION, "max_tokens": 8, "temperature": 1.0, "seed": 7}
    first, second = (_chat(chat_url, sampled).json() for _ in range(2))
    assert first["choices"][0]["message"] == second["choices"][0]["message"]


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (b"{not json", None, None),
        ({"messages": QUESTION, "tool_choice": "required"}, "tool_choice", None),
        (
            {"messages": [{"role": "user", "content": "word " * 9000}]},
            "messages",
            "context_length_exceeded",
        ),
    ],
)
def test_refusals_are_openai_errors(
    chat_url: str, body: Any, param: str | None, code: str | None
) -> None:
    with httpx2.Client(timeout=60) as http:
        content = body if isinstance(body, bytes) else orjson.dumps(body)
        response = http.post(f"{chat_url}/v1/chat/completions", content=content)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code)


def test_models_lists_the_one_model(chat_url: str) -> None:
    with httpx2.Client() as http:
        body = http.get(f"{chat_url}/v1/models").json()
    assert [m["id"] for m in body["data"]] == [MODEL_ID]


async def test_openai_sdk_reads_both_ways(chat_url: str) -> None:
    async with httpx2.AsyncClient() as http:
        client = openai.AsyncOpenAI(
            base_url=f"{chat_url}/v1", api_key="unused", max_retries=0, http_client=http
        )
        plain = await client.chat.completions.create(
            model=MODEL_ID, messages=QUESTION, max_tokens=SHORT
        )
        stream = await client.chat.completions.create(
            model=MODEL_ID,
            messages=QUESTION,
            max_tokens=SHORT,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces = [chunk async for chunk in stream]
    assert plain.choices[0].message.content
    assert plain.usage is not None
    text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
    assert text == plain.choices[0].message.content
    assert pieces[-1].usage == plain.usage


async def test_concurrent_calls_take_turns_and_each_gets_its_own_answer(chat_url: str) -> None:
    requests = [
        {"messages": QUESTION, "max_tokens": SHORT},
        {"messages": ENDS, "max_tokens": SHORT, "stream": True},
        {"messages": ENDS, "max_tokens": SHORT},
    ]
    alone = [_chat(chat_url, {**r, "stream": False}).json() for r in requests]
    async with httpx2.AsyncClient(timeout=60) as http:
        together = await asyncio.gather(
            *(http.post(f"{chat_url}/v1/chat/completions", json=r) for r in requests)
        )
    streamed = "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in _events(together[1])[:-1]
        if c["choices"]
    )
    assert together[0].json()["choices"] == alone[0]["choices"]
    assert streamed == alone[1]["choices"][0]["message"]["content"]
    assert together[2].json()["choices"] == alone[2]["choices"]


async def test_a_client_leaving_mid_stream_stops_nothing_else(chat_url: str) -> None:
    body = {"messages": QUESTION, "max_tokens": 1024, "stream": True}
    async with (
        httpx2.AsyncClient(timeout=60) as http,
        http.stream("POST", f"{chat_url}/v1/chat/completions", json=body) as response,
    ):
        async for _ in response.aiter_bytes():
            break  # the first piece came: leave
    after = _chat(chat_url, {"messages": ENDS, "max_tokens": ROOM})
    assert after.status_code == 200
    assert after.json()["choices"][0]["finish_reason"] == "stop"


def test_a_cancelled_generation_ends_at_its_next_token(engine: LocalEngine) -> None:
    call = parse_chat_request({"messages": QUESTION, "max_tokens": 1024})
    cancel = threading.Event()
    done = engine.generate(
        engine.prompt(call.messages), call.sampling, lambda _: cancel.set(), cancel
    )
    assert 0 < done.completion_tokens < 5
