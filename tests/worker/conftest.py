"""A fake upstream and a capture worker in front of it, both on real sockets."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from rollcap._runtime.serving import serving
from rollcap.staging import CAPTURE_FIELD, COORDS_FIELD, CommitCoords
from rollcap.testing import FakeUpstream
from rollcap.worker import WorkerSettings, create_worker_app
from tests.conftest import SECRETS

UPSTREAM_KEY, CLIENT_KEY = SECRETS
CHAT = "/v1/chat/completions"
FIRST_QUESTION = "Which option is correct?"


def settings_for(upstream_url: str, staging_dir: Path, **extra: Any) -> WorkerSettings:
    return replace(
        WorkerSettings(upstream_url=upstream_url, staging_dir=staging_dir, api_key=UPSTREAM_KEY),
        **extra,
    )


@contextlib.asynccontextmanager
async def worker_at(settings: WorkerSettings) -> AsyncIterator[str]:
    async with serving(create_worker_app(settings)) as url:
        yield url


def admission(
    model_call_id: str,
    *,
    rollout_id: str = "r-0",
    parent: str | None = None,
    pin: list[int] | None = None,
) -> dict[str, Any]:
    return {
        "rollout_id": rollout_id,
        "model_call_id": model_call_id,
        "parent_model_call_id": parent,
        "required_prefix_token_ids": pin,
    }


def chat_body(
    messages: list[dict[str, Any]] | None = None,
    capture: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "fake-model",
        "messages": messages or [{"role": "user", "content": FIRST_QUESTION}],
        "stream": False,
        **extra,
    }
    if capture is not None:
        body[CAPTURE_FIELD] = capture
    return body


def client_headers(scenario: str = "text", **extra: str) -> dict[str, str]:
    """What the model server sends; its own credential must never reach the upstream."""
    return {"x-fake-scenario": scenario, "authorization": f"Bearer {CLIENT_KEY}", **extra}


@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict[str, str]

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)

    @property
    def coords(self) -> CommitCoords:
        return CommitCoords.from_json(self.json[COORDS_FIELD])


@dataclass
class Worker:
    url: str
    staging_dir: Path
    session: aiohttp.ClientSession

    async def post(self, body: dict[str, Any], scenario: str = "text", **headers: str) -> Reply:
        async with self.session.post(
            self.url + CHAT, data=orjson.dumps(body), headers=client_headers(scenario, **headers)
        ) as response:
            return Reply(response.status, await response.read(), dict(response.headers))

    async def get(self, path: str) -> Reply:
        async with self.session.get(self.url + path) as response:
            return Reply(response.status, await response.read(), dict(response.headers))

    async def health(self) -> dict[str, Any]:
        reply = await self.get("/health")
        assert reply.status == 200
        health: dict[str, Any] = reply.json
        return health


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream(api_key=UPSTREAM_KEY) as server:
        yield server


@pytest.fixture
def staging_dir(tmp_path: Path) -> Path:
    return tmp_path / "staging"


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


@pytest.fixture
async def worker(
    upstream: FakeUpstream, staging_dir: Path, session: aiohttp.ClientSession
) -> AsyncIterator[Worker]:
    async with worker_at(settings_for(upstream.url + "/v1", staging_dir)) as url:
        yield Worker(url, staging_dir, session)


StubHandler = Callable[[dict[str, Any]], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def stub_upstream(handler: StubHandler) -> AsyncIterator[str]:
    """A minimal chat endpoint answering each parsed request with ``handler``'s response."""

    async def chat(request: web.Request) -> web.StreamResponse:
        return await handler(await request.json())

    app = web.Application()
    app.router.add_post(CHAT, chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
