"""A rollout worker run in-process against a model server, and the driver's choice of worker."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

pytest.importorskip("ray")

from rollcap._runtime.serving import serving
from rollcap.cluster import RolloutWorker, WorkerPool
from rollcap.cluster._actors import Member
from rollcap.cluster._wire import decode_outcome, encode_request
from rollcap.cluster._workers import AGENT_TARGET, REPLICA_TARGET
from rollcap.collect import Rollout, RolloutOutcome
from rollcap.evidence import CAPTURE_KEY, OBSERVATIONS_KEY, PERF_KEY, TRAJECTORY_KEY
from rollcap.gym import example_data_path
from rollcap.server import ModelServerSettings, create_model_app
from rollcap.store import CaptureStore, read_model_call_records
from rollcap.testing import FakeUpstream

PLAN = {"model_type": "openai_model", "resources_server": "mcqa", "agent": "mcqa_simple_agent"}


@contextlib.asynccontextmanager
async def model_servers(capture: Path, count: int) -> AsyncIterator[list[str]]:
    async with FakeUpstream() as upstream, contextlib.AsyncExitStack() as stack:
        settings = ModelServerSettings("openai_model", upstream.url + "/v1", capture_dir=capture)
        yield [
            await stack.enter_async_context(serving(create_model_app(settings)))
            for _ in range(count)
        ]


def _task() -> dict[str, Any]:
    first = example_data_path("mcqa").read_bytes().splitlines()[0]
    task: dict[str, Any] = orjson.loads(first)
    return task


def _config(capture: Path) -> dict[str, Any]:
    return {
        "observability_enabled": True,
        "model_call_capture_dir": str(capture),
        "policy_base_url": "http://unused",
    }


async def test_a_worker_runs_its_agent_against_the_replica_it_is_given(tmp_path: Path) -> None:
    capture = tmp_path / "calls"
    async with model_servers(capture, 2) as replicas:
        worker = RolloutWorker(
            str(capture), _config(capture), PLAN, "mcqa_simple_agent", 30, "127.0.0.1"
        )
        started = await worker.start()
        try:
            assert set(started) == {"url", "node_id", "warnings"}
            outcomes = []
            for task_index, replica in enumerate([replicas[0], replicas[1], replicas[0]]):
                rollout = Rollout(task_index, 0, 0, _task())
                CaptureStore(capture).reset(rollout.rollout_id)
                outcomes.append(await worker.run(rollout, REPLICA_TARGET, replica))
            # One agent per replica, started on first use.
            assert len(worker.agents) == 2
        finally:
            await worker.stop()
        await worker.wait_stopped()
    for task_index, outcome in enumerate(outcomes):
        assert outcome.kind == RolloutOutcome.OK
        line = orjson.loads(outcome.line)
        assert line["rollout_id"] == f"{task_index}-0"
        assert line[CAPTURE_KEY]["metrics"]["num_calls"] == 1


async def test_a_workers_line_carries_the_agents_evidence_joined_with_its_calls(
    tmp_path: Path,
) -> None:
    # simple_agent on the calculator: the fake upstream's tool_turns model calls two tools,
    # then answers; the agent answers its own ng_trajectory and ng_agent_observations.
    capture = tmp_path / "calls"
    config = {**_config(capture), "policy_model_name": "tool_turns"}
    plan = {"model_type": "openai_model", "resources_server": "calculator", "agent": "simple_agent"}
    task = orjson.loads(example_data_path("calculator").read_bytes().splitlines()[1])
    rollout = Rollout(0, 0, 0, task)
    async with model_servers(capture, 1) as (replica,):
        worker = RolloutWorker(str(capture), config, plan, "simple_agent", 30, "127.0.0.1")
        assert "error" not in await worker.start()
        try:
            CaptureStore(capture).reset(rollout.rollout_id)
            outcome = await worker.run(rollout, REPLICA_TARGET, replica)
        finally:
            await worker.stop()
    assert outcome.kind == RolloutOutcome.OK, outcome.line
    line = orjson.loads(outcome.line)
    calls = read_model_call_records(CaptureStore(capture), rollout.rollout_id)
    assert len(calls) == 3
    # The same line local collection builds: the bundle joined with the captured calls, under
    # the model server's name the worker's agent was given.
    observations = line[OBSERVATIONS_KEY]
    assert observations["source"] == "simple_agent"
    assert observations["records"][0]["model_calls"] == [
        {
            "model_call_id": c.model_call_id,
            "model_ref": {"type": "responses_api_models", "name": "policy_model"},
            "response_id": c.response_id,
        }
        for c in calls
    ]
    assert observations["gaps"] == []
    trajectory = line[TRAJECTORY_KEY]
    assert len(trajectory["turns"]) == 3
    assert [t["tool_name"] for t in trajectory["tool_calls"]] == ["add", "subtract"]
    assert [c["model_call_id"] for c in trajectory["model_calls"]] == [
        c.model_call_id for c in calls
    ]
    assert trajectory["gaps"] == []
    # ng_perf from the captured calls and tools, with the /run wall-clock the worker measured.
    perf = line[PERF_KEY]
    assert (perf["num_turns"], perf["num_tool_calls"]) == (3, 2)
    assert perf["prompt_tokens"] == sum(c.tokens_in or 0 for c in calls)
    assert perf["completion_tokens"] == sum(c.tokens_out or 0 for c in calls)
    assert perf["total_latency_ms"] >= sum(c.latency_total_ms or 0 for c in calls)
    assert line[CAPTURE_KEY]["metrics"]["num_calls"] == 3


async def test_a_worker_compacts_each_capture_once_its_line_is_built(tmp_path: Path) -> None:
    capture = tmp_path / "calls"
    rollout = Rollout(0, 0, 0, _task())
    async with model_servers(capture, 1) as (replica,):
        worker = RolloutWorker(
            str(capture), _config(capture), PLAN, "mcqa_simple_agent", 30, "127.0.0.1",
            compress_capture_level=5,
        )  # fmt: skip
        assert "error" not in await worker.start()
        try:
            CaptureStore(capture).reset(rollout.rollout_id)
            outcome = await worker.run(rollout, REPLICA_TARGET, replica)
        finally:
            await worker.stop()
    assert outcome.kind == RolloutOutcome.OK, outcome.line
    assert orjson.loads(outcome.line)[CAPTURE_KEY]["metrics"]["num_calls"] == 1
    store = CaptureStore(capture)
    compressed = store.rollout_ids(compressed=True)
    assert (compressed, store.rollout_ids(compressed=False)) == (["0-0"], [])
    assert len(read_model_call_records(store, rollout.rollout_id)) == 1


async def test_a_worker_reports_failures_as_lines_never_as_exceptions(tmp_path: Path) -> None:
    worker = RolloutWorker(None, None, {}, None, 5, "127.0.0.1")
    started = await worker.start()
    rollout = Rollout(0, 0, 0, {})
    try:
        unreachable = await worker.run(rollout, AGENT_TARGET, "http://127.0.0.1:9")
        # A worker without an agent of its own cannot be sent to a replica: its own error.
        broken = await worker.run(rollout, REPLICA_TARGET, "http://127.0.0.1:9")
        # The same over its POST /rollout, as the driver sends it.
        async with aiohttp.ClientSession() as session:
            body = encode_request(rollout, AGENT_TARGET, "http://127.0.0.1:9")
            async with session.post(started["url"] + "/rollout", data=body) as answer:
                assert answer.status == 200
                served = decode_outcome(answer.headers, await answer.read())
            async with session.post(started["url"] + "/rollout", data=b"[]") as answer:
                assert answer.status == 400
                assert await answer.text() == "the body must be a JSON object"
    finally:
        await worker.stop()
    assert served.kind == RolloutOutcome.FAILED
    assert orjson.loads(served.line)["error"]["kind"] == "connection"
    assert unreachable.kind == RolloutOutcome.FAILED
    assert orjson.loads(unreachable.line)["error"]["kind"] == "connection"
    assert broken.kind == RolloutOutcome.FAILED
    assert orjson.loads(broken.line)["error"]["kind"] == "worker_error"


async def test_a_worker_that_cannot_start_says_why(tmp_path: Path) -> None:
    worker = RolloutWorker(None, _config(tmp_path), PLAN, "no_such_agent", None, "127.0.0.1")
    assert "no agent named 'no_such_agent'" in (await worker.start())["error"]
    await worker.stop()


async def test_the_lock_probe_from_a_worker(tmp_path: Path) -> None:
    worker = RolloutWorker(None, None, {}, None, None)
    path = tmp_path / "probe"
    path.touch()
    assert await worker.try_lock(str(path))


def test_a_rollout_goes_to_the_least_busy_worker_next_to_its_replica() -> None:
    members = [Member(f"w{i}", None, node) for i, node in enumerate(["a", "a", "b"])]
    pool = WorkerPool(members)
    members[0].in_flight = 3
    assert pool.pick("a") is members[1]
    assert pool.pick("b") is members[2]
    assert pool.pick(None) is members[1]
    members[2].alive = False
    assert pool.pick("b") is members[1]  # none left on b: the least busy anywhere
    for m in members:
        m.alive = False
    with pytest.raises(RuntimeError, match="every rollout worker died"):
        pool.pick("a")
