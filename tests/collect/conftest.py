"""A stub agent server on a real socket, writing fake capture records like a model server would.

The stub reads its behaviour from the task's fields: ``calls`` (how many model calls it
"makes", default 1, each sent with ``x-session-id: s``), ``delay`` (seconds before
answering), ``fail`` (``http500``, ``json400``, ``badjson``, ``noreward``, ``hang``; ``first``
fails attempt 0 only), ``same_id`` (its calls share one model call id, which no trajectory can
hold), ``observe`` (it answers ``ng_agent_observations`` with one invocation, ``s``, whose
calls join it by their session id), ``damage`` (a torn line after its calls, and the
incomplete marker a failed write leaves).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollcap._runtime.serving import serving
from rollcap.ids import rollout_id_from_run
from rollcap.store import CaptureStore
from rollcap.store._frames import Frame, read_frames


def fake_record(
    rollout_id: str, index: int, *, request: bool = True, session: str | None = "s"
) -> dict[str, Any]:
    """A raw record as the capturing model server writes it (Responses dialect), the call sent
    with ``x-session-id: <session>``."""
    record: dict[str, Any] = {
        "model_call_id": f"{rollout_id.replace('-', '')}x{index:04d}".ljust(32, "0"),
        "dialect": "responses",
        "model_ref": {"type": "responses_api_models", "name": "policy_model"},
        "started_at": 1786032154.0 + index,
        "completed_at": 1786032154.5 + index,
        "latency_ms": 10.25 + index,
        "latency_ttft_ms": None,
        "status_code": 200,
        "error_category": None,
        "request": {"model": "fake-model", "input": f"{rollout_id} call {index}"}
        if request
        else None,
        "response": {
            "id": f"resp_{rollout_id}_{index}",
            "model": "fake-model-2025",
            "status": "completed",
            "output": [],
            "usage": {"input_tokens": 10 + index, "output_tokens": 5, "total_tokens": 15 + index},
        },
    }
    if session is not None:
        record["client_session_id"] = session
    return record


@dataclass
class StubAgent:
    url: str
    store: CaptureStore
    runs: list[str] = field(default_factory=list)  # rollout ids, in arrival order
    release: asyncio.Event = field(default_factory=asyncio.Event)


def write_input(path: Path, tasks: Iterable[dict[str, Any] | str]) -> Path:
    """One task per line; a string is written as it is (blank lines, broken lines)."""
    with open(path, "wb") as f:
        for task in tasks:
            f.write(task.encode() if isinstance(task, str) else orjson.dumps(task))
            f.write(b"\n")
    return path


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def read_frames_whole(path: Path) -> list[bytes]:
    """The contents of a compressed file's frames, each checked to be whole lines; fails the
    test on any stretch that is no frame."""
    parts = list(read_frames(path.read_bytes()))
    assert parts, f"{path} holds no frame"
    contents = []
    for part in parts:
        assert isinstance(part, Frame), f"{path}: {part}"
        assert part.content.endswith(b"\n")
        contents.append(part.content)
    return contents


def read_frame_lines(path: Path) -> list[dict[str, Any]]:
    """The lines of a compressed file (``read_frames_whole``), parsed."""
    return [orjson.loads(line) for part in read_frames_whole(path) for line in part.splitlines()]


def make_app(agent: StubAgent, *, record_runs: bool = True) -> Starlette:
    async def run(request: Request) -> Response:
        body = orjson.loads(await request.body())
        rollout_id = rollout_id_from_run(body)
        assert rollout_id is not None
        if record_runs:
            agent.runs.append(rollout_id)
        fail = body.get("fail")
        if fail == "first" and body["_ng_attempt_index"] == 0:
            fail = "http500"
        for index in range(body.get("calls", 1)):
            record = fake_record(rollout_id, index)
            if body.get("same_id"):
                record["model_call_id"] = "d" * 32
            await asyncio.to_thread(agent.store.append, rollout_id, record)
        if body.get("damage"):
            with open(agent.store.path_for(rollout_id), "ab") as capture:
                capture.write(b'{"model_call_id": "torn\n')
            await asyncio.to_thread(agent.store.mark_incomplete, rollout_id)
        if body.get("delay"):
            await asyncio.sleep(body["delay"])
        if fail == "hang":
            await agent.release.wait()
        if fail == "http500":
            return Response(b"agent exploded", status_code=500)
        if fail == "json400":
            return Response(b'{"detail": "bad task"}', 400, media_type="application/json")
        if fail == "badjson":
            return Response(b"{not json", media_type="application/json")
        answer: dict[str, Any] = {"response": {"output_text": f"answer {rollout_id}"}}
        if fail != "noreward":
            answer["reward"] = float(body["_ng_task_index"] % 2)
        answer["agent_note"] = "stub"
        if body.get("observe"):
            invocation = {"kind": "agent_invocation", "invocation_id": "s", "status": "completed"}
            answer["ng_agent_observations"] = {"source": "stub", "records": [invocation]}
        return Response(orjson.dumps(answer), media_type="application/json")

    return Starlette(routes=[Route("/run", run, methods=["POST"])])


@pytest.fixture
def capture_dir(tmp_path: Path) -> Path:
    return tmp_path / "model-calls"


@pytest.fixture
async def agent(capture_dir: Path) -> AsyncIterator[StubAgent]:
    stub = StubAgent(url="", store=CaptureStore(capture_dir))
    async with serving(make_app(stub)) as url:
        stub.url = url
        try:
            yield stub
        finally:
            stub.release.set()
    stub.store.close()
