"""A fake upstream and a capturing model server in front of it, both on real sockets."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
import pytest

from rollcap._runtime.serving import serving
from rollcap.server import ModelServerSettings, create_model_app
from rollcap.store import CaptureStore
from rollcap.testing import FakeUpstream
from tests.conftest import SECRETS

UPSTREAM_KEY, CLIENT_KEY = SECRETS
ROUTES = {
    "responses": "/v1/responses",
    "chat": "/v1/chat/completions",
    "messages": "/v1/messages",
}


@dataclass
class Stack:
    """An OpenAI-type and an Anthropic-type model server sharing one capture directory."""

    upstream: FakeUpstream
    openai_url: str
    anthropic_url: str
    store: CaptureStore
    session: aiohttp.ClientSession

    def base(self, dialect: str) -> str:
        return self.anthropic_url if dialect == "messages" else self.openai_url

    def url(self, dialect: str, rollout_id: str | None = "0-0") -> str:
        prefix = f"/ng-rollout/{rollout_id}" if rollout_id else ""
        return self.base(dialect) + prefix + ROUTES[dialect]

    def direct_url(self, dialect: str) -> str:
        return self.upstream.url + ROUTES[dialect]


def request_body(dialect: str, *, stream: bool, **extra: object) -> dict[str, object]:
    if dialect == "responses":
        body: dict[str, object] = {"model": "fake-model", "input": "Which option is correct?"}
    elif dialect == "chat":
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "Which option?"}]}
        if stream:
            body["stream_options"] = {"include_usage": True}
    else:
        body = {
            "model": "fake-model",
            "max_tokens": 256,
            "messages": [{"role": "user", "content": "Which option is correct?"}],
        }
    return {**body, "stream": stream, **extra}


def client_headers(
    dialect: str, scenario: str = "text", *, key: str = CLIENT_KEY, **extra: str
) -> dict[str, str]:
    """What an SDK sends. The key is the client's own: rollcap must replace it upstream."""
    headers = {"x-fake-scenario": scenario, **extra}
    if dialect == "messages":
        headers |= {"x-api-key": key, "anthropic-version": "2023-06-01"}
    else:
        headers["authorization"] = f"Bearer {key}"
    return headers


@contextlib.asynccontextmanager
async def model_server(settings: ModelServerSettings) -> AsyncIterator[str]:
    async with serving(create_model_app(settings)) as url:
        yield url


def settings_for(
    upstream_url: str, capture_dir: Path | None, **extra: object
) -> ModelServerSettings:
    base = ModelServerSettings(
        model_type="openai_model",
        base_url=upstream_url + "/v1",
        api_key=UPSTREAM_KEY,
        capture_dir=capture_dir,
    )
    return replace(base, **extra)  # type: ignore[arg-type]


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream(api_key=UPSTREAM_KEY) as server:
        yield server


@pytest.fixture
async def stack(upstream: FakeUpstream, tmp_path: Path) -> AsyncIterator[Stack]:
    capture_dir = tmp_path / "model-calls"
    anthropic = settings_for(upstream.url, capture_dir, model_type="anthropic_model")
    async with (
        model_server(settings_for(upstream.url, capture_dir)) as openai_url,
        model_server(anthropic) as anthropic_url,
        aiohttp.ClientSession() as session,
    ):
        yield Stack(upstream, openai_url, anthropic_url, CaptureStore(capture_dir), session)
