"""Gym servers on real sockets: an upstream, a capturing model server, resources, an agent."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollcap._runtime.serving import bind, uvicorn_server
from rollcap.gym import (
    AgentSettings,
    CalculatorResourcesServer,
    McqaResourcesServer,
    ResourcesServer,
    SimpleResponsesAgent,
    create_agent_app,
    create_resources_app,
)
from rollcap.server import ModelServerSettings, create_model_app
from rollcap.testing import FakeUpstream

# Every HTTP call a test makes ends within this, so a hung server fails the test, not the run.
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=20)

TASK: dict[str, Any] = {
    "responses_create_params": {
        "input": [
            {
                "role": "user",
                "content": "Which planet is largest?\n\nA) Mars\nB) Venus\nC) Jupiter\nD) Earth\n\n"
                "Answer with the letter of the correct option (A, B, C or D) only.",
            }
        ]
    },
    "options": [{"A": "Mars"}, {"B": "Venus"}, {"C": "Jupiter"}, {"D": "Earth"}],
    "expected_answer": "C",
}


def responses_object(text: str, model: object) -> dict[str, Any]:
    """A minimal, complete Responses API response carrying ``text``."""
    return {
        "id": "resp_stub_0001",
        "object": "response",
        "created_at": 1786032154,
        "status": "completed",
        "model": model,
        "output": [
            {
                "type": "message",
                "id": "msg_stub_0001",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "usage": {"input_tokens": 40, "output_tokens": 6, "total_tokens": 46},
    }


@dataclass
class StubModel:
    """A Responses upstream that answers ``text`` after ``delay_s``; notes what it received."""

    text: str = "The answer is C."
    delay_s: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> Starlette:
        async def responses(request: Request) -> Response:
            body = orjson.loads(await request.body())
            self.requests.append(body)
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            return Response(
                orjson.dumps(responses_object(self.text, body.get("model"))),
                media_type="application/json",
            )

        # Also under the prefix: a test may point an agent straight at the stub.
        return Starlette(
            routes=[
                Route("/v1/responses", responses, methods=["POST"]),
                Route("/ng-rollout/{rollout_id}/v1/responses", responses, methods=["POST"]),
            ]
        )


@dataclass
class GymStack:
    upstream_url: str
    model_url: str
    resources_url: str
    agent_url: str
    capture_dir: Path
    session: aiohttp.ClientSession

    async def post(self, url: str, body: object) -> tuple[int, Any]:
        payload = body if isinstance(body, bytes) else orjson.dumps(body)
        async with self.session.post(
            url, data=payload, headers={"content-type": "application/json"}
        ) as response:
            return response.status, orjson.loads(await response.read())

    def captured(self, rollout_id: str) -> list[dict[str, Any]]:
        path = self.capture_dir / f"{rollout_id}.capture.jsonl"
        return [orjson.loads(line) for line in path.read_bytes().splitlines()]


class ServerGroup:
    """Apps served on 127.0.0.1 from this event loop, stopped together.

    Built on rollcap._runtime.serving like ``serving``, but the servers wind down concurrently: each
    uvicorn shutdown waits out a 0.1 s tick, and a stack has four of them.
    """

    def __init__(self) -> None:
        self._servers: list[tuple[Any, asyncio.Task[None], socket.socket]] = []

    def add(self, app: Any) -> str:
        """Start serving ``app``; its base URL. The socket listens at once, so a client may
        connect before the server has finished starting."""
        sock = bind("127.0.0.1", 0)
        server = uvicorn_server(app)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        self._servers.append((server, task, sock))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    async def wait_started(self) -> None:
        for server, task, _ in self._servers:
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("server stopped before it started")
                await asyncio.sleep(0.005)

    async def __aenter__(self) -> ServerGroup:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for server, _, _ in self._servers:
            server.should_exit = True
        try:
            await asyncio.gather(*(task for _, task, _ in self._servers))
        finally:
            for _, _, sock in self._servers:
                sock.close()


@contextlib.asynccontextmanager
async def gym_stack(
    upstream: str | StubModel,
    capture_dir: Path,
    *,
    resources: ResourcesServer | None = None,
    model_url: str | None = None,
    resources_url: str | None = None,
    **agent_options: Any,
) -> AsyncIterator[GymStack]:
    """A capturing model server in front of ``upstream`` (a URL, or a stub served here too), a
    resources server and an agent.

    ``model_url`` / ``resources_url`` point the agent somewhere else instead (a dead port).
    """
    async with (
        ServerGroup() as group,
        aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session,
    ):
        upstream_url = upstream if isinstance(upstream, str) else group.add(upstream.app())
        model_settings = ModelServerSettings(
            model_type="openai_model", base_url=upstream_url + "/v1", capture_dir=capture_dir
        )
        model_server = group.add(create_model_app(model_settings))
        resources_server = group.add(create_resources_app(resources or McqaResourcesServer()))
        settings = AgentSettings(
            model_base_url=model_url or model_server,
            resources_base_url=resources_url or resources_server,
            name="mcqa_simple_agent",
            **{"model_name": "stub-model", **agent_options},
        )
        agent_server = group.add(create_agent_app(SimpleResponsesAgent(settings)))
        await group.wait_started()
        yield GymStack(
            upstream_url, model_server, resources_server, agent_server, capture_dir, session
        )


@contextlib.asynccontextmanager
async def calculator_stack(capture_dir: Path, **agent_options: Any) -> AsyncIterator[GymStack]:
    """The fake upstream playing ``tool_turns`` (it calls the request's tools twice, then
    answers) behind a gym stack with the calculator's resources server."""
    async with (
        FakeUpstream() as upstream,
        gym_stack(
            upstream.url,
            capture_dir,
            resources=CalculatorResourcesServer(),
            **{"model_name": "tool_turns", "model_server_name": "policy_model", **agent_options},
        ) as stack,
    ):
        yield stack


def dead_url() -> str:
    """A URL nothing listens on: a port bound and released at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def stub() -> StubModel:
    return StubModel()


@pytest.fixture
async def stub_stack(stub: StubModel, tmp_path: Path) -> AsyncIterator[GymStack]:
    async with gym_stack(stub, tmp_path / "model-calls") as stack:
        yield stack


@pytest.fixture
async def fake_stack(tmp_path: Path) -> AsyncIterator[GymStack]:
    async with (
        FakeUpstream() as upstream,
        gym_stack(upstream.url, tmp_path / "model-calls") as stack,
    ):
        yield stack
