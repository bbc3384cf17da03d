"""The embedded chat server on a loopback port, for the life of a ``local_model`` server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from rollcap._runtime.serving import serving
from rollcap.local._app import create_chat_app
from rollcap.local._engine import LocalEngine

__all__ = ["embedded_chat_server"]

_HOST = "127.0.0.1"  # never reachable from elsewhere: the server asks for no credentials


@contextlib.asynccontextmanager
async def embedded_chat_server(path: Path | None = None) -> AsyncIterator[str]:
    """Load the model and serve it on a free loopback port; yields the base URL (no ``/v1``).

    The process's Ctrl-C and SIGTERM belong to the server that embeds this one (``serving``
    leaves signals alone): it stops first and stops this one from its lifespan, so no call
    finds the model gone.
    """
    engine = await asyncio.to_thread(LocalEngine.load, path)
    try:
        async with serving(create_chat_app(engine), _HOST, 0) as url:
            yield url
    finally:
        await asyncio.to_thread(engine.close)
