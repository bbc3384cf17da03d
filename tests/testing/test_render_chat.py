"""The Chat Completions renderer: chunks, the usage chunk when asked for, ``[DONE]``."""

from __future__ import annotations

import orjson

from tests.testing._support import (
    decode,
    reply,
    request,
    streamed,
)


def test_chat_stream_chunks_usage_and_done() -> None:
    events = decode(streamed("chat", request("chat"), {"x-fake-events": "2"}).events)
    assert all(event.event is None for event in events)
    assert events[-1].data == "[DONE]"
    chunks = [orjson.loads(event.data) for event in events[:-1]]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["total_tokens"] > 0
    assert all(chunk["usage"] is None for chunk in chunks[:-1])


def test_chat_stream_without_include_usage_has_no_usage() -> None:
    r = reply("chat", request("chat", stream=True))
    chunks = [orjson.loads(event.data) for event in decode(r.events)[:-1]]
    assert all("usage" not in chunk for chunk in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
