"""A fake upstream and a capture worker in front of it, both on real sockets."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from rollcap._runtime.serving import serving
from rollcap.staging import (
    CAPTURE_FIELD,
    COORDS_FIELD,
    CallRecord,
    CaptureAdmission,
    CommitCoords,
    DirectoryStagingSink,
    LinearizedRow,
    linearize,
)
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


def root_admission(model_call_id: str, *, rollout_id: str = "r-0") -> dict[str, Any]:
    """A root call's ``ng_capture``, as the gate sends it (all nine keys)."""
    return CaptureAdmission(
        rollout_id=rollout_id, model_call_id=model_call_id, mode="text"
    ).model_dump(mode="json")


def child_admission(
    model_call_id: str,
    parent: CommitCoords,
    chain: Sequence[str],
    *,
    inline: Sequence[int] = (),
) -> dict[str, Any]:
    """A continuation of ``parent`` (its staged coords): ``chain`` is the keys root -> parent
    and the inline prefix empty, as the gate builds it; or ``inline`` is the prefix."""
    return CaptureAdmission(
        rollout_id=parent.rollout_id,
        model_call_id=model_call_id,
        parent_call_id=parent.model_call_id,
        prev_len=parent.cum_len,
        mode="token_in",
        required_prefix_token_ids=list(inline),
        staging_chain=list(chain),
        parent_chain_hash=parent.chain_hash,
    ).model_dump(mode="json")


def chat_body(
    messages: list[dict[str, Any]] | None = None,
    capture: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A chat request as the gate sends it to the worker (STAGING §1.4)."""
    body: dict[str, Any] = {
        "model": "fake-model",
        "messages": messages or [{"role": "user", "content": FIRST_QUESTION}],
        "stream": False,
        **extra,
    }
    if capture is not None:
        body[CAPTURE_FIELD] = capture
        body.update(logprobs=True, top_logprobs=0, return_tokens_as_token_ids=True)
        if capture.get("mode") == "token_in":
            body.setdefault("required_prefix_token_ids", capture["required_prefix_token_ids"])
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
        return CommitCoords.model_validate(self.json[COORDS_FIELD])

    @property
    def answer(self) -> dict[str, Any]:
        """The engine's answer: the body without the coords."""
        return {k: v for k, v in self.json.items() if k != COORDS_FIELD}


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

    async def counts(self) -> tuple[int, int, int]:
        """``(staged, capture_failed, in_flight)`` from ``/health``."""
        health = await self.health()
        return health["staged"], health["capture_failed"], health["in_flight"]


def record_json(staging_dir: Path, rollout_id: str, model_call_id: str) -> dict[str, Any]:
    """The staged record as it is on disk (``<dir>/<rollout>/<call>/record.json``)."""
    data: dict[str, Any] = orjson.loads(
        (staging_dir / rollout_id / model_call_id / "record.json").read_bytes()
    )
    return data


def staged_files(staging_dir: Path) -> list[Path]:
    return sorted(p for p in staging_dir.rglob("*") if p.is_file())


def manifest_rows(coords: Sequence[CommitCoords]) -> list[CallRecord]:
    """The manifest rows a gate would write for these staged coords (fingerprints left out)."""
    return [
        CallRecord.model_validate(
            {
                **c.model_dump(exclude={"rollout_id", "disposition"}),
                "mode": "text" if c.parent_call_id is None else "token_in",
                "response_id": f"chatcmpl-{c.model_call_id}",
            }
        )
        for c in coords
    ]


def rebuild(staging_dir: Path, chain: Sequence[CommitCoords]) -> LinearizedRow:
    """The trainer's row for the chain root -> last, verified from the staging directory."""
    keys = [c.staging_key for c in chain]
    assert None not in keys
    snapshots = DirectoryStagingSink(staging_dir).fetch([k for k in keys if k is not None])
    return linearize(
        chain[0].rollout_id,
        snapshots,
        manifest_rows(chain),
        terminal_hint=chain[-1].model_call_id,
    )


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


def vllm_answer(
    prompt: list[int],
    generated: list[int],
    logprobs: list[float] | None = None,
    **message: Any,
) -> dict[str, Any]:
    """A vLLM chat completion with the token fields the worker asks for."""
    scores = [-0.5] * len(generated) if logprobs is None else logprobs
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 1,
        "model": "stub",
        "prompt_token_ids": prompt,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok", **message},
                "finish_reason": "stop",
                "token_ids": generated,
                "logprobs": {
                    "content": [
                        {"token": f"token_id:{t}", "logprob": s, "bytes": [], "top_logprobs": []}
                        for t, s in zip(generated, scores, strict=True)
                    ]
                },
            }
        ],
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
