"""Agents end to end: upstream -> capturing model server -> mcqa resources -> agent."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from rollcap._runtime.serving import serving
from rollcap.affinity import choose_replica
from rollcap.gym import (
    AGENTS,
    RESOURCES_SERVERS,
    AgentSettings,
    InvalidRequest,
    McqaResourcesServer,
    ResourcesServer,
    ResponsesAgent,
    SimpleResponsesAgent,
    create_agent_app,
    create_resources_app,
    example_data_path,
)
from rollcap.testing import FakeUpstream
from tests.gym.conftest import TASK, GymStack, StubModel, dead_url, gym_stack

INDICES = {"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_attempt_index": 0}


def _agent_request(model: str = "stub-model") -> dict[str, Any]:
    return {**TASK["responses_create_params"], "model": model}


async def test_run_grades_a_right_answer_and_captures_the_call(
    stub_stack: GymStack, stub: StubModel
) -> None:
    status, result = await stub_stack.post(stub_stack.agent_url + "/run", {**TASK, **INDICES})
    assert status == 200
    assert result["reward"] == 1.0
    assert result["extracted_answer"] == "C"
    assert result["response"]["id"] == "resp_stub_0001"
    assert list(result)[:2] == ["response", "reward"]
    # The model got the task's request with the agent's model name filled in.
    assert stub.requests == [_agent_request()]
    [record] = stub_stack.captured("3-1")
    assert record["request"] == _agent_request()
    assert record["response"] == result["response"]
    assert record["status_code"] == 200
    assert record["dialect"] == "responses"
    assert sorted(p.name for p in stub_stack.capture_dir.iterdir()) == ["3-1.capture.jsonl"]


async def test_run_grades_a_wrong_answer(stub_stack: GymStack, stub: StubModel) -> None:
    stub.text = "I'd say B."
    status, result = await stub_stack.post(stub_stack.agent_url + "/run", {**TASK, **INDICES})
    assert status == 200
    assert (result["reward"], result["extracted_answer"]) == (0.0, "B")


async def test_run_keeps_the_tasks_own_model_and_resume_attempts_get_their_own_file(
    stub_stack: GymStack, stub: StubModel
) -> None:
    params = {**TASK["responses_create_params"], "model": "task-model"}
    body = {**TASK, "responses_create_params": params, **INDICES, "_ng_attempt_index": 2}
    status, _ = await stub_stack.post(stub_stack.agent_url + "/run", body)
    assert status == 200
    assert stub.requests[-1]["model"] == "task-model"
    [record] = stub_stack.captured("3-1-a2")
    assert record["request"] == params
    status, _ = await stub_stack.post(
        stub_stack.agent_url + "/run", {**TASK, "_ng_rollout_id": "custom.7"}
    )
    assert status == 200
    assert len(stub_stack.captured("custom.7")) == 1


async def test_run_through_the_fake_upstream(fake_stack: GymStack) -> None:
    """The fake's sentence names no option: graded, reward 0.0, captured under the rollout."""
    status, result = await fake_stack.post(fake_stack.agent_url + "/run", {**TASK, **INDICES})
    assert status == 200
    assert (result["reward"], result["extracted_answer"]) == (0.0, None)
    [record] = fake_stack.captured("3-1")
    assert record["request"] == _agent_request()
    assert record["response"] == result["response"]


async def test_run_every_example_line(stub_stack: GymStack, stub: StubModel) -> None:
    """The shipped data goes through the agent as it is; an answer-C model gets the C tasks."""
    lines = example_data_path("mcqa").read_bytes().splitlines()
    rewards = []
    for index, line in enumerate(lines):
        task = orjson.loads(line)
        run = {**task, "_ng_task_index": index, "_ng_rollout_index": 0}
        status, result = await stub_stack.post(stub_stack.agent_url + "/run", run)
        assert status == 200, result
        assert result["reward"] == (1.0 if task["expected_answer"] == "C" else 0.0)
        rewards.append(result["reward"])
        [record] = stub_stack.captured(f"{index}-0")
        assert record["request"] == {**task["responses_create_params"], "model": "stub-model"}
    assert 0 < sum(rewards) < len(lines)


async def _example_rewards(model: str, capture_dir: Path) -> list[float]:
    """The reward of each shipped example line, answered by the fake upstream as ``model``."""
    rewards = []
    async with (
        FakeUpstream() as upstream,
        gym_stack(upstream.url, capture_dir, model_name=model) as stack,
    ):
        for index, line in enumerate(example_data_path("mcqa").read_bytes().splitlines()):
            run = {**orjson.loads(line), "_ng_task_index": index, "_ng_rollout_index": 0}
            status, result = await stack.post(stack.agent_url + "/run", run)
            assert status == 200, result
            # The answer is one option letter, which the grader reads as it is.
            [message] = result["response"]["output"]
            assert message["content"][0]["text"] == result["extracted_answer"]
            rewards.append(result["reward"])
    return rewards


async def test_choice_models_grade_the_example_lines_apart(tmp_path: Path) -> None:
    """Two seeds of the fake's ``choice`` are two runs to compare: each gets some tasks right and
    some wrong, and they differ on some task."""
    first = await _example_rewards("choice-1", tmp_path / "first")
    second = await _example_rewards("choice-2", tmp_path / "second")
    assert 0 < sum(first) < len(first)
    assert 0 < sum(second) < len(second)
    assert first != second


# -- the self-call route


async def test_prefixed_self_call_is_captured_under_its_rollout(
    stub_stack: GymStack, stub: StubModel
) -> None:
    url = stub_stack.agent_url + "/ng-rollout/7-2/v1/responses"
    async with stub_stack.session.post(url, json={"input": "Which option?"}) as response:
        assert response.status == 200
        body = orjson.loads(await response.read())
        call_id = response.headers["x-rollcap-model-call-id"]
    assert body["output"][0]["content"][0]["text"] == "The answer is C."
    [record] = stub_stack.captured("7-2")
    assert record["request"] == {"input": "Which option?", "model": "stub-model"}
    assert record["model_call_id"] == call_id


async def test_unprefixed_self_call_is_forwarded_uncaptured(
    stub_stack: GymStack, stub: StubModel
) -> None:
    status, body = await stub_stack.post(
        stub_stack.agent_url + "/v1/responses", {"input": "hi", "model": "own-model"}
    )
    assert status == 200
    assert body["model"] == "own-model"
    assert not stub_stack.capture_dir.exists() or not any(stub_stack.capture_dir.iterdir())
    async with stub_stack.session.get(stub_stack.model_url + "/health") as response:
        health = orjson.loads(await response.read())
    assert (health["uncorrelated"], health["captured"]) == (1, 0)


async def test_streamed_self_call_passes_the_stream_through(fake_stack: GymStack) -> None:
    url = fake_stack.agent_url + "/ng-rollout/7-2/v1/responses"
    async with fake_stack.session.post(url, json={"input": "hi", "stream": True}) as response:
        assert response.status == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = await response.read()
    assert b"event: response.completed" in raw
    [record] = fake_stack.captured("7-2")
    assert record["response_raw"] == raw.decode()
    assert record["response"]["status"] == "completed"


async def test_a_model_stream_that_breaks_off_breaks_the_self_calls_stream_the_same_way(
    fake_stack: GymStack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    url = fake_stack.agent_url + "/ng-rollout/7-3/v1/responses"
    body = {"input": "hi", "stream": True, "model": "truncate"}
    async with fake_stack.session.post(url, json=body) as response:
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()  # no clean end an SDK could take for a finished answer
    messages = [(r.name, r.getMessage()) for r in caplog.records]
    assert not [m for m in messages if "Exception in ASGI application" in m[1]]
    ours = [m for m in messages if "upstream broke off its answer" in m[1]]
    assert sorted(m[0] for m in ours) == ["rollcap.gym", "rollcap.server"]  # each hop, once


async def test_self_call_passes_a_model_error_through(fake_stack: GymStack) -> None:
    url = fake_stack.agent_url + "/ng-rollout/7-2/v1/responses"
    status, body = await fake_stack.post(url, {"input": "hi", "model": "http_429"})
    assert status == 429
    assert "error" in body


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/ng-rollout/bad%2Fid/v1/responses", 400, "Invalid rollout id"),
        ("/ng-rollout/.hidden/v1/responses", 400, "Invalid rollout id"),
        ("/ng-rollout/7-2/run", 404, "only /v1/responses"),
        ("/ng-rollout/7-2/health", 404, "only /v1/responses"),
    ],
)
async def test_prefix_errors(stub_stack: GymStack, path: str, status: int, message: str) -> None:
    got, body = await stub_stack.post(stub_stack.agent_url + path, {**TASK, **INDICES})
    assert got == status
    assert message in body["error"]["message"]


async def test_self_call_bad_body(stub_stack: GymStack) -> None:
    status, body = await stub_stack.post(
        stub_stack.agent_url + "/ng-rollout/7-2/v1/responses", b"["
    )
    assert status == 400
    assert "not valid JSON" in body["error"]["message"]


# -- malformed run bodies


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        ({**INDICES}, "responses_create_params must be a JSON object, got none"),
        ({**TASK, "responses_create_params": "hi"}, "got a string"),
        (
            {**TASK, "responses_create_params": {"input": "x", "stream": True}},
            "stream must be false",
        ),
        ({**TASK, "_ng_task_index": -1, "_ng_rollout_index": 0}, "Invalid rollout id: '-1-0'"),
        ({**TASK, **INDICES, "_ng_attempt_index": "x"}, "_ng_attempt_index"),
        ({**TASK, "_ng_rollout_id": "../etc"}, "_ng_rollout_id must be a string"),
    ],
)
async def test_malformed_run_is_400(stub_stack: GymStack, body: object, message: str) -> None:
    status, result = await stub_stack.post(stub_stack.agent_url + "/run", body)
    assert status == 400
    assert result["error"]["type"] == "invalid_request_error"
    assert message in result["error"]["message"]


async def test_malformed_task_fields_are_reported_from_verify(stub_stack: GymStack) -> None:
    """The task's grading fields are checked by the resources server: its 400 comes back 502."""
    body = {**TASK, **INDICES, "expected_answer": "Z"}
    status, result = await stub_stack.post(stub_stack.agent_url + "/run", body)
    assert status == 502
    assert result["error"]["server"] == "resources"
    assert result["error"]["status"] == 400
    assert "expected_answer" in result["error"]["message"]


# -- downstream failures


async def test_model_server_down_is_502_naming_it(tmp_path: Path) -> None:
    dead = dead_url()
    async with gym_stack(dead, tmp_path, model_url=dead) as stack:
        status, result = await stack.post(stack.agent_url + "/run", {**TASK, **INDICES})
        assert status == 502
        error = result["error"]
        assert error["server"] == "model"
        assert error["type"] == "upstream_error"
        assert "status" not in error
        assert error["message"].startswith(f"model server unreachable at {dead}/ng-rollout/3-1/")
        status, result = await stack.post(stack.agent_url + "/v1/responses", {"input": "hi"})
        assert status == 502
        assert result["error"]["server"] == "model"


async def test_model_server_answering_an_error_is_502_with_its_status(tmp_path: Path) -> None:
    async with (
        FakeUpstream() as upstream,
        gym_stack(upstream.url, tmp_path, model_name="http_500") as stack,
    ):
        status, result = await stack.post(stack.agent_url + "/run", {**TASK, **INDICES})
        assert status == 502
        error = result["error"]
        assert (error["server"], error["status"]) == ("model", 500)
        assert error["message"].startswith("model server answered 500 from ")
        # The failed call is captured too.
        [record] = stack.captured("3-1")
        assert record["status_code"] == 500


class Failing(ResourcesServer):
    name = "failing"

    async def verify(self, body: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("grader exploded")


async def test_resources_server_answering_500_is_502_naming_it(
    stub: StubModel, tmp_path: Path
) -> None:
    async with gym_stack(stub, tmp_path, resources=Failing()) as stack:
        status, result = await stack.post(stack.agent_url + "/run", {**TASK, **INDICES})
        assert status == 502
        error = result["error"]
        assert (error["server"], error["status"]) == ("resources", 500)
        assert "resources server answered 500" in error["message"]
        assert "grader exploded" in error["message"]
        # The model call happened and stays captured, whatever the grading did.
        assert len(stack.captured("3-1")) == 1


async def test_resources_server_down_is_502(stub: StubModel, tmp_path: Path) -> None:
    async with gym_stack(stub, tmp_path, resources_url=dead_url()) as stack:
        status, result = await stack.post(stack.agent_url + "/run", {**TASK, **INDICES})
        assert status == 502
        assert result["error"]["server"] == "resources"
        assert "resources server unreachable" in result["error"]["message"]


async def test_slow_model_is_504(tmp_path: Path) -> None:
    slow = StubModel(delay_s=0.5)
    async with (
        serving(slow.app()) as slow_url,
        gym_stack(slow_url, tmp_path, model_url=slow_url, model_read_timeout_s=0.1) as stack,
    ):
        status, result = await stack.post(stack.agent_url + "/run", {**TASK, **INDICES})
        assert status == 504
        assert result["error"]["server"] == "model"
        assert result["error"]["type"] == "timeout"


# -- settings, registries, the base class


def test_settings_normalize_and_validate() -> None:
    settings = AgentSettings("http://m:8000/v1/", "http://r:9000/")
    assert settings.model_base_url == "http://m:8000"
    assert settings.resources_base_url == "http://r:9000"
    with pytest.raises(ValueError, match="model_base_url"):
        AgentSettings("m:8000", "http://r")
    with pytest.raises(ValueError, match="verify_timeout_s"):
        AgentSettings("http://m", "http://r", verify_timeout_s=0)


def test_settings_take_several_model_servers() -> None:
    settings = AgentSettings(("http://m0:8000/v1", "http://m1:8000/"), "http://r")
    assert settings.model_base_url == ("http://m0:8000", "http://m1:8000")
    assert AgentSettings(["http://m/v1"], "http://r").model_base_url == "http://m"  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one model server"):
        AgentSettings((), "http://r")
    with pytest.raises(ValueError, match="must start with http"):
        AgentSettings(("http://m", "m1"), "http://r")


async def test_an_agent_with_two_model_servers_keeps_each_rollout_on_one(
    tmp_path: Path,
) -> None:
    stubs = [StubModel(), StubModel()]
    async with contextlib.AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(serving(stub.app())) for stub in stubs]
        resources = await stack.enter_async_context(
            serving(create_resources_app(McqaResourcesServer()))
        )
        agent = SimpleResponsesAgent(AgentSettings(tuple(urls), resources))
        await stack.enter_async_context(serving(create_agent_app(agent)))  # its session
        for task in range(10):
            for _ in range(2):
                body = {**TASK, "_ng_task_index": task, "_ng_rollout_index": 0}
                assert (await agent.run(body))["reward"] == 1.0
    for url, stub in zip(urls, stubs, strict=True):
        mine = [t for t in range(10) if choose_replica(f"{t}-0", urls) == url]
        assert len(stub.requests) == 2 * len(mine)
    assert stubs[0].requests
    assert stubs[1].requests


def test_registries() -> None:
    assert isinstance(RESOURCES_SERVERS["mcqa"](), McqaResourcesServer)
    spec = AGENTS["mcqa_simple_agent"]
    assert spec.resources_server in RESOURCES_SERVERS
    agent = spec.create(AgentSettings("http://m", "http://r", model_name="x"))
    assert isinstance(agent, SimpleResponsesAgent)


async def test_base_agent_needs_run_and_a_session() -> None:
    agent = ResponsesAgent(AgentSettings("http://m", "http://r"))
    with pytest.raises(NotImplementedError):
        await agent.run({})
    with pytest.raises(RuntimeError, match="not started"):
        _ = agent.session
    await agent.start()
    try:
        with pytest.raises(RuntimeError, match="already started"):
            await agent.start()
    finally:
        await agent.stop()
    assert issubclass(InvalidRequest, ValueError)


async def test_health(stub_stack: GymStack) -> None:
    async with stub_stack.session.get(stub_stack.agent_url + "/health") as response:
        assert response.status == 200
        assert orjson.loads(await response.read()) == {
            "status": "ok",
            "name": "mcqa_simple_agent",
        }
    session: aiohttp.ClientSession = stub_stack.session
    async with session.get(stub_stack.agent_url + "/run") as response:
        assert response.status == 405
