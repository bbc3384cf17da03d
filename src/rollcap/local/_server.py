"""The embedded chat server on a loopback port, for the life of a ``local_model`` server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import uvicorn

from rollcap._runtime.serving import bind, uvicorn_server
from rollcap.local._app import create_chat_app
from rollcap.local._engine import LocalEngine

__all__ = ["embedded_chat_server"]

_HOST = "127.0.0.1"  # never reachable from elsewhere: the server asks for no credentials


class _EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The process's Ctrl-C and SIGTERM belong to the server that embeds this one: it stops
        # first and stops this one from its lifespan, so no call finds the model gone.
        yield


@contextlib.asynccontextmanager
async def embedded_chat_server(path: Path | None = None) -> AsyncIterator[str]:
    """Load the model and serve it on a free loopback port; yields the base URL (no ``/v1``)."""
    engine = await asyncio.to_thread(LocalEngine.load, path)
    try:
        sock = bind(_HOST, 0)
        try:
            server = _EmbeddedServer(uvicorn_server(create_chat_app(engine)).config)
            task = asyncio.create_task(server.serve(sockets=[sock]))
            try:
                while not server.started:
                    if task.done():
                        task.result()  # it failed to start: raise its error here
                        raise RuntimeError("the embedded model server stopped before it started")
                    await asyncio.sleep(0.005)
                yield f"http://{_HOST}:{sock.getsockname()[1]}"
            finally:
                server.should_exit = True
                await task
        finally:
            sock.close()
    finally:
        await asyncio.to_thread(engine.close)
