"""A rollout whose agent talks to the model server over a Responses WebSocket: collection and
the evidence see no difference. An in-process agent runs a five-turn tool conversation with the
official SDK's WebSocket client (each turn continues the last by ``previous_response_id``),
through a capturing model server in front of the fake upstream, pass-through and translated;
the rollout line joins its five calls, builds one trajectory turn per call and counts them in
``ng_perf``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollcap._runtime.serving import serving
from rollcap.collect import collect
from rollcap.evidence import CAPTURE_KEY, OBSERVATIONS_KEY, PERF_KEY, TRAJECTORY_KEY
from rollcap.ids import rollout_id_from_run
from rollcap.report import RunFiles, build_report, unpack
from rollcap.store import CaptureStore
from rollcap.testing import FakeUpstream
from tests.collect.conftest import read_lines, write_input
from tests.server.conftest import CLIENT_KEY, UPSTREAM_KEY, model_server, settings_for

TURNS = 5
TOOLS = [
    {
        "type": "function",
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
    }
]


def _agent(model_url: str) -> Starlette:
    async def run(request: Request) -> Response:
        body = orjson.loads(await request.body())
        rollout_id = rollout_id_from_run(body)
        client = openai.AsyncOpenAI(
            base_url=f"{model_url}/ng-rollout/{rollout_id}/v1", api_key=CLIENT_KEY, max_retries=0
        )
        headers = {
            "x-session-id": "s",
            "x-fake-scenario": "tool_turns",
            "x-fake-tool-turns": str(TURNS - 1),
        }
        event: dict[str, Any] = {
            "type": "response.create",
            "model": "fake-model",
            "input": [{"role": "user", "content": body["question"]}],
            "tools": TOOLS,
        }
        text = ""
        async with client.responses.connect(extra_headers=headers) as connection:
            for _ in range(TURNS):
                await connection.send(event)  # type: ignore[arg-type]
                async for server_event in connection:
                    if server_event.type == "response.completed":
                        response = server_event.response
                        break
                calls = [item for item in response.output if item.type == "function_call"]
                if not calls:
                    text = response.output_text
                    break
                event = {
                    "type": "response.create",
                    "model": "fake-model",
                    "previous_response_id": response.id,
                    "input": [
                        {"type": "function_call_output", "call_id": c.call_id, "output": "7"}
                        for c in calls
                    ],
                    "tools": TOOLS,
                }
        await client.close()
        observations = {
            "source": "test",
            "records": [{"kind": "agent_invocation", "invocation_id": "s", "status": "completed"}],
        }
        answer = {
            "response": {"output_text": text},
            "reward": 1.0,
            OBSERVATIONS_KEY: observations,
        }
        return Response(orjson.dumps(answer), media_type="application/json")

    return Starlette(routes=[Route("/run", run, methods=["POST"])])


@pytest.mark.parametrize("model_type", ["openai_model", "vllm_model"])
async def test_a_websocket_rollout_is_joined_and_its_trajectory_has_a_turn_per_call(
    tmp_path: Path, model_type: str
) -> None:
    capture = tmp_path / "model-calls"
    async with FakeUpstream(api_key=UPSTREAM_KEY) as upstream:
        settings = settings_for(upstream.url, capture, model_type=model_type)
        async with model_server(settings) as model_url, serving(_agent(model_url)) as agent_url:
            summary = await collect(
                agent_url,
                write_input(tmp_path / "tasks.jsonl", [{"question": "Look up four words."}]),
                tmp_path / "rollouts.jsonl",
                capture_dir=capture,
            )
    assert (summary.ran, summary.failed) == (1, 0)
    (line,) = read_lines(tmp_path / "rollouts.jsonl")
    raws = CaptureStore(capture).read("0-0")
    assert len(raws) == TURNS
    assert all(r["transport"] == "websocket" for r in raws)
    assert line[CAPTURE_KEY]["metrics"]["num_calls"] == TURNS
    trajectory = line[TRAJECTORY_KEY]
    ids = [r["model_call_id"] for r in raws]
    assert [c["model_call_id"] for c in trajectory["model_calls"]] == ids
    # Each call's response id is its own, and each turn continues the one before.
    response_ids = [c["response_metadata"]["response_id"] for c in trajectory["model_calls"]]
    assert response_ids == [r["response"]["id"] for r in raws]
    previous = [r["request"].get("previous_response_id") for r in raws]
    assert previous == [None, *response_ids[:-1]]
    # One turn per call, joined by the session; a turn's question is what that turn sent (the
    # chain's new items), its answer what it got.
    turns = trajectory["turns"]
    assert [t["model_calls"][0]["model_call_id"] for t in turns] == ids
    assert turns[0]["question"][0]["content"] == "Look up four words."
    assert all(t["question"][0]["type"] == "function_call_output" for t in turns[1:])
    assert [t["step_count"] for t in turns] == list(range(TURNS))
    perf = line[PERF_KEY]
    assert perf["num_turns"] == TURNS
    assert perf["token_observability_coverage"] == 1.0
    assert line["response"]["output_text"]
    # The report reads the turns as calls: each one, streamed, none an error.
    page, stats = build_report(RunFiles(capture, tmp_path / "rollouts.jsonl"))
    assert (stats.rollouts, stats.calls) == (1, TURNS)
    match = re.search(
        r'<script type="application/json" id="rollcap-data">(.*?)</script>', page, re.S
    )
    assert match is not None
    summary = unpack(orjson.loads(match.group(1))["summary"])
    assert summary["calls"]["stream"] == [True] * TURNS
    assert summary["calls"]["err"] == [None] * TURNS
