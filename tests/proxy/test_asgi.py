from __future__ import annotations

from typing import Any

from rollcap._proxy.asgi import send_json


async def test_send_json_answers_whole_with_its_length() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    await send_json(send, 404, b'{"error":{}}')
    assert sent == [
        {
            "type": "http.response.start",
            "status": 404,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"12")],
        },
        {"type": "http.response.body", "body": b'{"error":{}}'},
    ]
