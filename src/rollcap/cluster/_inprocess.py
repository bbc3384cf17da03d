"""An ASGI app called in-process: a worker's own agent, without a socket in between.

A rollout worker runs its agent in its own process; posting ``/run`` to it over loopback HTTP
would cost a client, a server and two parses per rollout for nothing. ``asgi_caller`` turns the
app into a ``rollcap.collect.AgentCall`` that hands it the request as an ASGI server would and
gathers its answer. The app's lifespan (the agent's session) is run by ``lifespan``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

from starlette.applications import Starlette

from rollcap.collect import AgentCall

__all__ = ["asgi_caller", "lifespan"]


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    """The app started (its lifespan's start-up run) for the block, and shut down after."""
    async with app.router.lifespan_context(app):
        yield


def asgi_caller(app: Starlette, path: str) -> AgentCall:
    """``POST path`` with a JSON body to ``app``, in-process: ``(status, body)``."""

    async def call(body: bytes) -> tuple[int, bytes]:
        done = asyncio.Event()
        delivered = False
        status = 0
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await done.wait()  # asked again only to learn that the client left
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    done.set()

        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0),
            "state": {},
        }
        try:
            await app(scope, receive, send)
        finally:
            done.set()
        return status, b"".join(chunks)

    return call
