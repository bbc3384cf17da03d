"""Answers a pure-ASGI middleware sends itself, before any app sees the request."""

from __future__ import annotations

from starlette.types import Send

__all__ = ["send_json"]


async def send_json(send: Send, status: int, body: bytes) -> None:
    """A whole JSON answer: ``status``, its content type and length, ``body``."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
