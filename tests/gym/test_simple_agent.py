"""simple_agent end to end: the fake upstream's tool conversation, the calculator's tools, a
capturing model server and collection, each on a real socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollcap import CaptureStore, read_model_call_records
from rollcap.collect import collect
from rollcap.evidence import TrajectoryRecord
from rollcap.gym import CalculatorResourcesServer, example_data_path
from rollcap.testing import FakeUpstream
from tests.gym.conftest import GymStack, StubModel, calculator_stack, gym_stack, responses_object

CALCULATOR = orjson.loads(example_data_path("calculator").read_bytes().splitlines()[1])
INDICES = {"_ng_task_index": 5, "_ng_rollout_index": 0, "_ng_attempt_index": 0}
SERVER_REF = {"type": "responses_api_models", "name": "policy_model"}


@pytest.fixture
async def tool_stack(tmp_path: Path) -> AsyncIterator[GymStack]:
    async with calculator_stack(tmp_path / "model-calls") as stack:
        yield stack


async def test_a_three_turn_rollout_with_two_tool_calls(tool_stack: GymStack) -> None:
    status, result = await tool_stack.post(tool_stack.agent_url + "/run", {**CALCULATOR, **INDICES})
    assert status == 200, result
    # The fake's final sentence holds no number: graded, reward 0.0.
    assert (result["reward"], result["extracted_answer"], result["resolved"]) == (0.0, None, False)
    records = tool_stack.captured("5-0")
    assert len(records) == 3
    # Each call carried the calculator's tools; the fake called add, then subtract.
    assert [tool["name"] for tool in records[0]["request"]["tools"]] == [
        "add",
        "subtract",
        "multiply",
    ]
    outputs = result["response"]["output"]
    calls = [item for item in outputs if item["type"] == "function_call"]
    assert [(c["name"], orjson.loads(c["arguments"])) for c in calls] == [
        ("add", {"a": 1.5, "b": 1.5}),
        ("subtract", {"a": 1.5, "b": 1.5}),
    ]
    # The second call sent back the first answer and the tool's result.
    second_input = records[1]["request"]["input"]
    assert second_input[-1] == {
        "type": "function_call_output",
        "call_id": calls[0]["call_id"],
        "output": '{"result":3.0}',
    }
    assert records[2]["request"]["input"][-1]["output"] == '{"result":0.0}'
    # The agent's own trajectory: valid, three turns, two timed tool calls.
    trajectory = TrajectoryRecord.model_validate(result["ng_trajectory"])
    assert (trajectory.task_id, trajectory.rollout_id) == ("5", "5-0")
    assert [turn.step_count for turn in trajectory.turns] == [0, 1, 2]
    assert [turn.resolved for turn in trajectory.turns] == [None, None, False]
    # The question is the request's input, its messages typed (as collection types them).
    assert trajectory.turns[0].question == [
        {"type": "message", **item} for item in records[0]["request"]["input"]
    ]
    assert [
        (ref.model_call_id, ref.response_id)
        for turn in trajectory.turns
        for ref in turn.model_calls
    ] == [(r["model_call_id"], r["response"]["id"]) for r in records]
    assert [(t.tool_name, t.status, t.timing_source) for t in trajectory.tool_calls] == [
        ("add", "completed", "executor"),
        ("subtract", "completed", "executor"),
    ]
    assert [t.output for t in trajectory.tool_calls] == ['{"result":3.0}', '{"result":0.0}']
    (root,) = trajectory.invocations
    assert root.status == "completed"
    assert len(root.conversation) == 1 + 2 * 2 + 1  # question, 2 x (call, output), answer
    assert trajectory.gaps == []


async def test_without_a_tool_the_agent_answers_in_one_call(
    stub: StubModel, tmp_path: Path
) -> None:
    async with gym_stack(stub, tmp_path, resources=CalculatorResourcesServer()) as stack:
        stub.text = "126"
        status, result = await stack.post(stack.agent_url + "/run", {**CALCULATOR, **INDICES})
    assert status == 200
    assert (result["reward"], result["extracted_answer"], result["resolved"]) == (1.0, 126, True)
    assert len(stub.requests) == 1
    trajectory = result["ng_trajectory"]
    assert [turn["resolved"] for turn in trajectory["turns"]] == [True]
    # No model server name configured: the calls are named by their captured ids alone.
    assert trajectory["invocations"][0]["model_calls"][0]["model_ref"] is None


async def test_max_steps_stops_the_loop(tmp_path: Path) -> None:
    async with (
        FakeUpstream() as upstream,
        gym_stack(
            upstream.url,
            tmp_path,
            resources=CalculatorResourcesServer(),
            model_name="tool_turns",
            max_steps=2,
        ) as stack,
    ):
        status, result = await stack.post(stack.agent_url + "/run", {**CALCULATOR, **INDICES})
        records = stack.captured("5-0")
    assert status == 200
    assert len(records) == 2
    trajectory = result["ng_trajectory"]
    assert trajectory["invocations"][0]["status"] == "incomplete"
    assert len(trajectory["tool_calls"]) == 1  # the second call's tool was never run


class ScriptedModel(StubModel):
    """A Responses upstream that calls ``multiply`` with a bad argument, then answers."""

    def app(self) -> Starlette:
        async def responses(request: Request) -> Response:
            body = orjson.loads(await request.body())
            self.requests.append(body)
            answer = responses_object("6", body.get("model"))
            answer["id"] = f"resp_{len(self.requests)}"
            if len(self.requests) == 1:
                answer["output"] = [
                    {
                        "type": "function_call",
                        "id": "fc_1",
                        "call_id": "call_1",
                        "name": "multiply",
                        "arguments": '{"a": "two", "b": 3}',
                        "status": "completed",
                    },
                    {
                        "type": "function_call",
                        "id": "fc_2",
                        "call_id": "call_2",
                        "name": "multiply",
                        "arguments": "not json",
                        "status": "completed",
                    },
                ]
            return Response(orjson.dumps(answer), media_type="application/json")

        return Starlette(routes=[Route("/v1/responses", responses, methods=["POST"])])


async def test_a_tool_error_is_the_tools_output_for_the_model(tmp_path: Path) -> None:
    model = ScriptedModel()
    async with gym_stack(model, tmp_path, resources=CalculatorResourcesServer()) as stack:
        status, result = await stack.post(stack.agent_url + "/run", {**CALCULATOR, **INDICES})
    assert status == 200, result
    sent_back = model.requests[1]["input"][-2:]
    assert [item["call_id"] for item in sent_back] == ["call_1", "call_2"]
    refused = orjson.loads(sent_back[0]["output"])
    assert refused["error"]["message"] == "a must be a finite number, got a string"
    assert sent_back[1]["output"].startswith("the arguments are not JSON")
    tools = result["ng_trajectory"]["tool_calls"]
    assert [(t["status"], t["error_type"]) for t in tools] == [
        ("failed", "http_400"),
        ("failed", "http_400"),
    ]
    assert result["reward"] == 0.0  # 6 is not (12 + 30) * 3


async def test_collection_joins_the_agents_evidence_with_the_captured_calls(
    tool_stack: GymStack, tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(orjson.dumps(CALCULATOR) + b"\n")
    async with asyncio.timeout(60):
        summary = await collect(
            tool_stack.agent_url,
            source,
            tmp_path / "out.jsonl",
            capture_dir=tool_stack.capture_dir,
            agent_name="simple_agent",
        )
    (line,) = [orjson.loads(raw) for raw in summary.output_path.read_bytes().splitlines()]
    calls = read_model_call_records(CaptureStore(tool_stack.capture_dir), "0-0")
    assert len(calls) == 3
    # The joined bundle: the invocation owns exactly the three captured calls, canonically.
    observations = line["ng_agent_observations"]
    assert observations["source"] == "simple_agent"
    root = observations["records"][0]
    assert root["model_calls"] == [
        {"model_call_id": c.model_call_id, "model_ref": SERVER_REF, "response_id": c.response_id}
        for c in calls
    ]
    assert observations["gaps"] == []
    assert [r["kind"] for r in observations["records"]] == ["agent_invocation", *["tool_call"] * 2]
    # The trajectory: the agent's turns and tools, the captured calls with their payloads.
    trajectory = line["ng_trajectory"]
    assert len(trajectory["turns"]) == 3
    assert [t["tool_name"] for t in trajectory["tool_calls"]] == ["add", "subtract"]
    assert [c["model_call_id"] for c in trajectory["model_calls"]] == [
        c.model_call_id for c in calls
    ]
    assert all(c["request"] is not None for c in trajectory["model_calls"])
    assert [g["code"] for g in trajectory["gaps"]] == []
    # ng_perf is what the captured calls and the tool calls imply.
    perf = line["ng_perf"]
    assert perf == {
        "num_turns": 3,
        "num_tool_calls": 2,
        "token_observability_coverage": 1.0,
        "prompt_tokens": sum(c.tokens_in or 0 for c in calls),
        "cached_prompt_tokens": sum(c.cached_tokens or 0 for c in calls),
        "completion_tokens": sum(c.tokens_out or 0 for c in calls),
        "reasoning_tokens": sum(c.tokens_reasoning or 0 for c in calls),
        "total_latency_ms": perf["total_latency_ms"],
    }
    assert perf["total_latency_ms"] >= sum(c.latency_total_ms or 0 for c in calls)
    (entry,) = summary.aggregate_metrics
    assert entry["agent_ref"] == {"name": "simple_agent"}
    assert entry["perf_summary"]["mean_num_turns"] == 3.0
    assert line["response"]["output"][-1]["type"] == "message"
    assert line["reward"] == 0.0


class NewItemModel(StubModel):
    """A Responses upstream whose answer holds an output item of a type no shape knows yet."""

    def app(self) -> Starlette:
        async def responses(request: Request) -> Response:
            body = orjson.loads(await request.body())
            self.requests.append(body)
            answer = responses_object("126", body.get("model"))
            answer["output"].insert(0, {"type": "future_item", "id": "fi_1", "payload": [1]})
            return Response(orjson.dumps(answer), media_type="application/json")

        return Starlette(routes=[Route("/v1/responses", responses, methods=["POST"])])


async def test_a_conversation_the_shapes_cannot_hold_is_a_transcript_gap(tmp_path: Path) -> None:
    model = NewItemModel()
    async with gym_stack(model, tmp_path, resources=CalculatorResourcesServer()) as stack:
        status, result = await stack.post(stack.agent_url + "/run", {**CALCULATOR, **INDICES})
    assert status == 200, result
    assert result["reward"] == 1.0  # the answer is still read and scored
    trajectory = TrajectoryRecord.model_validate(result["ng_trajectory"])
    assert trajectory.invocations[0].conversation == []
    assert {
        "code": "agent_transcript_unavailable",
        "detail": "ValidationError",
        "invocation_id": "root",
    } in result["ng_trajectory"]["gaps"]
    assert len(trajectory.turns) == 1
