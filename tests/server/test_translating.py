"""The server's translation glue, pure: the ids it is handed, errors in the client's dialect."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from rollcap.server._translating import Translation, error_for_client
from rollcap.sse import SSEEvent

CHAT = {
    "id": "chatcmpl-upstream",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hi."},
            "finish_reason": "stop",
        }
    ],
}


def test_the_client_sees_the_ids_and_time_it_was_handed() -> None:
    request = {"model": "m", "input": "hello"}
    translation = Translation("responses", request, answer_id="ab12", created=123.0)
    assert translation.chat_request["messages"] == [{"role": "user", "content": "hello"}]
    answer = translation.answer(CHAT)
    assert (answer["id"], answer["created_at"]) == ("resp_ab12", 123.0)
    again = Translation("responses", request, answer_id="ab12", created=123.0).answer(CHAT)
    assert again == answer  # nothing drawn from the clock or randomness
    chunk = {**CHAT, "object": "chat.completion.chunk", "choices": []}
    events = translation.stream().feed(SSEEvent(data=orjson.dumps(chunk).decode()))
    assert orjson.loads(events[0].data)["response"]["id"] == "resp_ab12"
    anthropic: dict[str, Any] = {"model": "m", "max_tokens": 5, "messages": [{"role": "user"}]}
    anthropic["messages"][0]["content"] = "hi"
    messages = Translation("messages", anthropic, answer_id="cd", created=0.0)
    assert messages.answer(CHAT)["id"] == "msg_cd"


@pytest.mark.parametrize(
    ("status", "body", "kind", "message"),
    [
        (429, b'{"error": {"message": "slow down"}}', "rate_limit_error", "slow down"),
        (500, b'{"message": "boom"}', "api_error", "boom"),
        (418, b"not json", "invalid_request_error", "not json"),
    ],
)
def test_an_upstream_error_as_the_anthropic_client_reads_it(
    status: int, body: bytes, kind: str, message: str
) -> None:
    assert orjson.loads(error_for_client("messages", status, body)) == {
        "type": "error",
        "error": {"type": kind, "message": message},
    }
    assert error_for_client("responses", status, body) == body
