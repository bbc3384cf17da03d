"""``collect`` against a stub agent on a real socket, with real capture files."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollcap._runtime.batch import BatchThread, call_each
from rollcap._runtime.serving import serving
from rollcap.collect import (
    CaptureCompactor,
    InputError,
    Rollout,
    RolloutOutcome,
    collect,
    dispatched_path,
    failures_path,
    http_agent,
    run_rollout,
)
from rollcap.evidence import CAPTURE_KEY, OBSERVATIONS_KEY, PERF_KEY, TRAJECTORY_KEY
from rollcap.records import GAP_NO_RECORDS, GAP_TRAJECTORY_PROJECTION_FAILED
from rollcap.store import CaptureStore, CompressedFileError, aggregate_model_call_metrics
from rollcap.store._frames import encode_frame
from tests.collect.conftest import (
    StubAgent,
    fake_record,
    read_frame_lines,
    read_frames_whole,
    read_lines,
    write_input,
)

# Every collection here ends well within this; a hang fails the test instead of the session.
BOUND_S = 60


def _keys(lines: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [(line["_ng_task_index"], line["_ng_rollout_index"]) for line in lines]


async def test_line_shape_and_metrics_match_the_capture_file(
    agent: StubAgent, tmp_path: Path, capture_dir: Path
) -> None:
    tasks = [{"question": f"q{i}", "calls": i, "observe": True} for i in range(3)]
    source = write_input(tmp_path / "in.jsonl", tasks)
    async with asyncio.timeout(BOUND_S):
        summary = await collect(
            agent.url, source, tmp_path / "out.jsonl", capture_dir=capture_dir, agent_name="stub"
        )
    lines = read_lines(summary.output_path)
    assert _keys(lines) == [(0, 0), (1, 0), (2, 0)]
    line = lines[2]
    assert list(line) == [
        "question",
        "calls",
        "observe",
        "_ng_task_index",
        "_ng_rollout_index",
        "_ng_attempt_index",
        "rollout_id",
        "response",
        "reward",
        "agent_note",
        OBSERVATIONS_KEY,
        CAPTURE_KEY,
        TRAJECTORY_KEY,
        PERF_KEY,
    ]
    assert line["response"] == {"output_text": "answer 2-0"}
    assert line["reward"] == 0.0
    capture = line[CAPTURE_KEY]
    assert set(capture) == {"rollout_id", "metrics", "calls"}
    assert capture["rollout_id"] == line["rollout_id"] == "2-0"
    assert capture["metrics"] == aggregate_model_call_metrics(agent.store, "2-0")
    assert capture["metrics"]["num_calls"] == 2
    assert capture["metrics"]["tokens_in"] == 10 + 11
    assert [c["call_index"] for c in capture["calls"]] == [0, 1]
    for call in capture["calls"]:
        assert not {"request", "response", "request_raw", "response_raw"} & set(call)
    trajectory = line[TRAJECTORY_KEY]
    raws = agent.store.read("2-0")
    assert [c["request"] for c in trajectory["model_calls"]] == [r["request"] for r in raws]
    assert [c["response"] for c in trajectory["model_calls"]] == [r["response"] for r in raws]
    assert (trajectory["schema_version"], trajectory["task_id"]) == ("1.0", "2")
    assert trajectory["rollout_id"] == "2-0"
    # The agent's invocation claimed its calls by their session id: joined, one turn each.
    (invocation,) = line[OBSERVATIONS_KEY]["records"]
    ids = [r["model_call_id"] for r in raws]
    assert [ref["model_call_id"] for ref in invocation["model_calls"]] == ids
    assert [turn["model_calls"][0]["model_call_id"] for turn in trajectory["turns"]] == ids
    perf = line[PERF_KEY]
    assert (perf["num_turns"], perf["num_tool_calls"], perf["prompt_tokens"]) == (2, 0, 21)
    assert perf["total_latency_ms"] > 0  # the collector's own clock around /run
    # A rollout that made no model call has a gap, and still its response and reward.
    assert lines[0][CAPTURE_KEY]["gaps"] == [{"code": GAP_NO_RECORDS}]
    assert lines[0]["reward"] == 0.0
    assert summary.rollouts_without_calls == 1
    assert summary.metrics["num_calls"] == 3
    (entry,) = orjson.loads(summary.metrics_path.read_bytes())
    assert entry == summary.aggregate_metrics[0]
    assert list(entry) == [
        "agent_ref",
        "_ng_environment_server",
        "agent_metrics",
        "key_metrics",
        "group_level_metrics",
        "repeat_level_metrics",
        "perf_summary",
    ]
    assert entry["agent_ref"] == {"name": "stub"}
    assert entry["agent_metrics"] == summary.metrics
    assert entry["perf_summary"]["overall_observability_coverage"] == 1.0
    assert entry["perf_summary"]["mean_num_turns"] == 4 / 3  # 1 (no call still counts one), 1, 2
    assert summary.perf_summary == entry["perf_summary"]
    assert not summary.failures_path.exists()


async def test_projection_failure_keeps_payloads(
    agent: StubAgent, tmp_path: Path, capture_dir: Path
) -> None:
    source = write_input(tmp_path / "in.jsonl", [{"same_id": True, "calls": 2}])
    async with asyncio.timeout(BOUND_S):
        summary = await collect(agent.url, source, tmp_path / "out.jsonl", capture_dir=capture_dir)
    (line,) = read_lines(summary.output_path)
    assert TRAJECTORY_KEY not in line
    assert PERF_KEY not in line
    capture = line[CAPTURE_KEY]
    assert capture["gaps"] == [
        {"code": GAP_TRAJECTORY_PROJECTION_FAILED, "detail": "ValidationError"}
    ]
    assert [call["response"] for call in capture["calls"]] == [
        fake_record("0-0", i)["response"] for i in range(2)
    ]
    assert line["reward"] == 0.0


async def test_a_damaged_capture_is_gaps_on_the_line_and_in_its_trajectory(
    agent: StubAgent, tmp_path: Path, capture_dir: Path
) -> None:
    source = write_input(tmp_path / "in.jsonl", [{"calls": 2, "damage": True, "observe": True}])
    async with asyncio.timeout(BOUND_S):
        summary = await collect(agent.url, source, tmp_path / "out.jsonl", capture_dir=capture_dir)
    (line,) = read_lines(summary.output_path)
    damage = [
        {"code": "model_call_capture_records_unreadable", "detail": "count=1"},
        {"code": "model_call_capture_incomplete"},
    ]
    assert line[CAPTURE_KEY]["gaps"] == damage
    assert line[CAPTURE_KEY]["metrics"]["num_calls"] == 2  # the whole lines still count
    copied = [g for g in line[TRAJECTORY_KEY]["gaps"] if g["code"].startswith("model_call_")]
    assert copied == [
        {"code": gap["code"], "invocation_id": None, "detail": gap.get("detail")} for gap in damage
    ]
    assert line[PERF_KEY]["num_turns"] == 2
    assert line["reward"] == 0.0


async def test_without_capture_there_is_no_attachment(agent: StubAgent, tmp_path: Path) -> None:
    source = write_input(tmp_path / "in.jsonl", [{"calls": 0}, {"calls": 0, "observe": True}])
    async with asyncio.timeout(BOUND_S):
        summary = await collect(agent.url, source, tmp_path / "out.jsonl")
    plain, observed = read_lines(summary.output_path)
    assert CAPTURE_KEY not in plain
    assert TRAJECTORY_KEY not in plain
    # The agent's own evidence still makes a trajectory; nothing is joined, nothing measured.
    assert CAPTURE_KEY not in observed
    assert PERF_KEY not in observed
    assert observed[TRAJECTORY_KEY]["invocations"][0]["invocation_id"] == "s"
    assert observed[OBSERVATIONS_KEY]["records"][0] == {
        "kind": "agent_invocation",
        "invocation_id": "s",
        "status": "completed",
    }  # as the agent sent it: not joined
    assert summary.metrics["num_calls"] is None
    assert summary.rollouts_without_calls is None
    assert "perf_summary" not in summary.aggregate_metrics[0]


async def test_limit_repeats_and_sorted_output(
    agent: StubAgent, tmp_path: Path, capture_dir: Path
) -> None:
    # Later tasks answer first, so the order of completion is not the sorted order.
    tasks: list[Any] = [{"t": i, "delay": (5 - i) * 0.01} for i in range(5)]
    tasks.insert(2, "")
    source = write_input(tmp_path / "in.jsonl", tasks)
    seen: list[tuple[int, int, int]] = []
    async with asyncio.timeout(BOUND_S):
        summary = await collect(
            agent.url,
            source,
            tmp_path / "out.jsonl",
            capture_dir=capture_dir,
            limit=3,
            num_repeats=2,
            concurrency=6,
            progress=lambda *args: seen.append(args),
        )
    lines = read_lines(summary.output_path)
    assert _keys(lines) == [(t, r) for t in range(3) for r in range(2)]
    assert [line["t"] for line in lines] == [0, 0, 1, 1, 2, 2]
    assert sorted(agent.runs) == ["0-0", "0-1", "1-0", "1-1", "2-0", "2-1"]
    assert seen[0] == (0, 0, 6)
    assert seen[-1] == (6, 0, 6)
    assert (summary.total, summary.ran, summary.failed, summary.skipped) == (6, 6, 0, 0)
    assert summary.mean_reward == pytest.approx(1 / 3)
    assert summary.metrics["rollouts"] == 6


async def test_failures_file(agent: StubAgent, tmp_path: Path, capture_dir: Path) -> None:
    tasks: list[dict[str, Any] | str] = [
        {"ok": True},
        {"fail": "http500"},
        {"fail": "json400"},
        {"fail": "badjson"},
        {"fail": "noreward"},
        {"fail": "hang"},
    ]
    source = write_input(tmp_path / "in.jsonl", tasks)
    async with asyncio.timeout(BOUND_S):
        summary = await collect(
            agent.url,
            source,
            tmp_path / "out.jsonl",
            capture_dir=capture_dir,
            request_timeout=0.5,
        )
    assert _keys(read_lines(summary.output_path)) == [(0, 0)]
    failures = {line["_ng_task_index"]: line for line in read_lines(summary.failures_path)}
    assert sorted(failures) == [1, 2, 3, 4, 5]
    assert failures[1]["rollout_id"] == "1-0"
    assert failures[1]["_ng_attempt_index"] == 0
    assert failures[1]["error"] == {
        "kind": "agent_error",
        "message": "the agent answered HTTP 500",
        "status": 500,
        "body": "agent exploded",
    }
    assert failures[2]["error"]["body"] == {"detail": "bad task"}
    assert failures[3]["error"]["kind"] == "bad_json"
    assert failures[4]["error"]["kind"] == "bad_answer"
    assert "reward" in failures[4]["error"]["message"]
    assert failures[5]["error"]["kind"] == "timeout"
    assert (summary.ran, summary.failed) == (6, 5)
    assert summary.metrics["failures"] == 5
    assert summary.metrics["rollouts"] == 1


async def test_unreachable_agent_is_a_connection_failure(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    source = write_input(tmp_path / "in.jsonl", [{}, {}])
    async with asyncio.timeout(BOUND_S):
        summary = await collect(f"http://127.0.0.1:{port}", source, tmp_path / "out.jsonl")
    kinds = [line["error"]["kind"] for line in read_lines(summary.failures_path)]
    assert kinds == ["connection", "connection"]
    assert summary.output_path.read_bytes() == b""
    assert summary.metrics["mean_reward"] is None


async def test_bad_input_fails_before_dispatch(agent: StubAgent, tmp_path: Path) -> None:
    source = write_input(tmp_path / "in.jsonl", [{}, "[1, 2]"])
    with pytest.raises(InputError, match="line 2"):
        await collect(agent.url, source, tmp_path / "out.jsonl")
    assert agent.runs == []


async def test_resume_retries_failures_with_a_new_attempt(
    agent: StubAgent, tmp_path: Path, capture_dir: Path
) -> None:
    source = write_input(tmp_path / "in.jsonl", [{"t": 0}, {"fail": "first", "calls": 2}])
    output = tmp_path / "out.jsonl"
    async with asyncio.timeout(BOUND_S):
        first = await collect(agent.url, source, output, capture_dir=capture_dir)
        assert first.failed == 1
        second = await collect(agent.url, source, output, capture_dir=capture_dir, resume=True)
    assert (second.ran, second.failed, second.skipped) == (1, 0, 1)
    lines = read_lines(output)
    assert [line["rollout_id"] for line in lines] == ["0-0", "1-0-a1"]
    assert lines[1][CAPTURE_KEY]["metrics"]["num_calls"] == 2
    assert len(agent.store.read("1-0")) == 2  # the failed attempt's calls, kept apart
    assert second.metrics["failures"] == 0
    assert second.metrics["rollouts"] == 2
    # The failed attempt stays in the failures file: the next resume counts it.
    assert [line["rollout_id"] for line in read_lines(second.failures_path)] == ["1-0"]


async def test_rerun_without_resume_starts_afresh(
    agent: StubAgent, tmp_path: Path, capture_dir: Path
) -> None:
    source = write_input(tmp_path / "in.jsonl", [{"fail": "first"}])
    output = tmp_path / "out.jsonl"
    async with asyncio.timeout(BOUND_S):
        await collect(agent.url, source, output, capture_dir=capture_dir)
        summary = await collect(agent.url, source, output, capture_dir=capture_dir)
    assert summary.failed == 1
    assert [line["rollout_id"] for line in read_lines(summary.failures_path)] == ["0-0"]


async def test_resume_after_a_killed_run(
    agent: StubAgent, tmp_path: Path, capture_dir: Path
) -> None:
    num_tasks, repeats = 30, 2
    tasks = [{"t": i, "calls": 1 + i % 3, "delay": 0.005} for i in range(num_tasks)]
    source = write_input(tmp_path / "in.jsonl", tasks)
    output = tmp_path / "out.jsonl"

    def kill_halfway(done: int, failed: int, total: int) -> None:
        if done == total // 2:
            victim.cancel()

    victim = asyncio.create_task(
        collect(
            agent.url,
            source,
            output,
            capture_dir=capture_dir,
            num_repeats=repeats,
            concurrency=8,
            progress=kill_halfway,
        )
    )
    async with asyncio.timeout(BOUND_S):
        with pytest.raises(asyncio.CancelledError):
            await victim
    # Simulate a kill in the middle of a write as well: a torn last line.
    with open(output, "ab") as f:
        f.write(b'{"_ng_task_index": 29, "_ng_rollout_index": 1, "respo')
    survivors = {
        (line["_ng_task_index"], line["_ng_rollout_index"]): line
        for line in read_lines_tolerant(output)
    }
    assert 0 < len(survivors) < num_tasks * repeats
    dispatched = {name.removesuffix(".capture.jsonl") for name in agent.store.rollout_ids()}

    async with asyncio.timeout(BOUND_S):
        summary = await collect(
            agent.url,
            source,
            output,
            capture_dir=capture_dir,
            num_repeats=repeats,
            concurrency=8,
            resume=True,
        )
    lines = read_lines(output)
    assert _keys(lines) == [(t, r) for t in range(num_tasks) for r in range(repeats)]
    assert summary.skipped == len(survivors)
    assert summary.ran == num_tasks * repeats - len(survivors)
    assert summary.metrics["rollouts"] == num_tasks * repeats
    retried = []
    for line in lines:
        key = (line["_ng_task_index"], line["_ng_rollout_index"])
        base_id = f"{key[0]}-{key[1]}"
        if key in survivors:
            assert line == survivors[key]
            continue
        if base_id in dispatched:
            # Dispatched by the killed run but never written: a new attempt with its own file.
            assert line["rollout_id"] == base_id + "-a1"
            retried.append(base_id)
        else:
            assert line["rollout_id"] == base_id
        calls = 1 + key[0] % 3
        assert line[CAPTURE_KEY]["metrics"]["num_calls"] == calls
        assert len(agent.store.read(line["rollout_id"])) == calls
        assert all(
            call["request"]["input"].startswith(line["rollout_id"] + " ")
            for call in line[TRAJECTORY_KEY]["model_calls"]
        )
    assert retried, "the kill left no rollout in flight"


def read_lines_tolerant(path: Path) -> list[dict[str, Any]]:
    out = []
    for raw in path.read_bytes().splitlines():
        with contextlib.suppress(orjson.JSONDecodeError):
            out.append(orjson.loads(raw))
    return out


# -- the dispatch journal and dispatches that come back lost ----------------------------------


def _journal(output: Path) -> list[str]:
    return [line["rollout_id"] for line in read_lines(dispatched_path(output))]


async def test_every_attempt_is_journaled_before_it_runs(
    agent: StubAgent, tmp_path: Path, capture_dir: Path
) -> None:
    source = write_input(tmp_path / "in.jsonl", [{"t": 0}, {"fail": "first"}])
    output = tmp_path / "out.jsonl"
    async with asyncio.timeout(BOUND_S):
        await collect(agent.url, source, output, capture_dir=capture_dir)
        assert sorted(_journal(output)) == sorted(agent.runs) == ["0-0", "1-0"]
        await collect(agent.url, source, output, capture_dir=capture_dir, resume=True)
        assert _journal(output)[2:] == ["1-0-a1"]
        # A fresh run starts a fresh journal; without capture there is none.
        await collect(agent.url, source, output, capture_dir=capture_dir)
        assert sorted(_journal(output)) == ["0-0", "1-0"]
        await collect(agent.url, source, output)
    assert not dispatched_path(output).exists()


async def test_resume_trusts_the_journal_over_the_capture_directory(
    agent: StubAgent, tmp_path: Path, capture_dir: Path
) -> None:
    source = write_input(tmp_path / "in.jsonl", [{"fail": "first"}])
    output = tmp_path / "out.jsonl"
    async with asyncio.timeout(BOUND_S):
        await collect(agent.url, source, output, capture_dir=capture_dir)
    # The listing misses the attempt (as another host's stale view would) and the failures
    # file went with it: the journal alone still says attempt 0 ran.
    agent.store.clear("0-0")
    failures_path(output).unlink()
    async with asyncio.timeout(BOUND_S):
        await collect(agent.url, source, output, capture_dir=capture_dir, resume=True)
    assert [line["rollout_id"] for line in read_lines(output)] == ["0-0-a1"]


class _LosingDispatch:
    """A dispatch that loses the first ``losses`` attempts of every rollout, then runs it."""

    def __init__(self, agent: StubAgent, capture_dir: Path, losses: int) -> None:
        self.agent = agent
        self.store = CaptureStore(capture_dir)
        self.losses = losses
        self.seen: list[str] = []
        self.io: BatchThread[tuple[Callable[..., Any], tuple[Any, ...]], Any] = BatchThread(
            call_each, "test-io"
        )

    async def __call__(self, rollout: Rollout) -> RolloutOutcome:
        self.seen.append(rollout.rollout_id)
        # The attempt's file exists, empty, when a dispatch is called.
        assert self.store.read(rollout.rollout_id) == []
        assert self.store.path_for(rollout.rollout_id).exists()
        if rollout.attempt_index < self.losses:
            # What ran it died after a model call: that attempt's record stays in its file.
            self.store.append(rollout.rollout_id, fake_record(rollout.rollout_id, 0))
            return RolloutOutcome.lost("the worker died")
        async with aiohttp.ClientSession() as session:
            agent = http_agent(session, self.agent.url + "/run")
            return await run_rollout(agent, rollout, self.store, self.io)


@pytest.mark.parametrize("lost_retries", [0, 1, 2])
async def test_a_lost_rollout_runs_again_under_the_next_attempt(
    agent: StubAgent, tmp_path: Path, capture_dir: Path, lost_retries: int
) -> None:
    source = write_input(tmp_path / "in.jsonl", [{"t": 0, "calls": 2}, {"t": 1, "calls": 2}])
    output = tmp_path / "out.jsonl"
    dispatch = _LosingDispatch(agent, capture_dir, losses=1)
    async with asyncio.timeout(BOUND_S):
        summary = await collect(
            None,
            source,
            output,
            capture_dir=capture_dir,
            dispatch=dispatch,
            lost_retries=lost_retries,
        )
    if lost_retries == 0:
        # Written nowhere, neither output nor failures; only the journal knows.
        assert (summary.ran, summary.failed, summary.lost) == (2, 0, 2)
        assert read_lines(output) == []
        assert not summary.failures_path.exists()
        assert sorted(dispatch.seen) == ["0-0", "1-0"]
        async with asyncio.timeout(BOUND_S):
            summary = await collect(agent.url, source, output, capture_dir=capture_dir, resume=True)
        assert summary.lost == 0
    else:
        assert (summary.ran, summary.failed, summary.lost) == (2, 0, 0)
        assert sorted(dispatch.seen) == ["0-0", "0-0-a1", "1-0", "1-0-a1"]
    lines = read_lines(output)
    assert [line["rollout_id"] for line in lines] == ["0-0-a1", "1-0-a1"]
    assert [line["_ng_attempt_index"] for line in lines] == [1, 1]
    for line in lines:
        # Only the new attempt's calls; the lost attempt's record stays in its own file.
        assert line[CAPTURE_KEY]["metrics"]["num_calls"] == 2
        assert len(agent.store.read(line["rollout_id"].removesuffix("-a1"))) == 1
    assert sorted(_journal(output)) == ["0-0", "0-0-a1", "1-0", "1-0-a1"]
    await asyncio.to_thread(dispatch.io.close)


async def test_lost_every_time_is_lost_once_counted(
    agent: StubAgent, tmp_path: Path, capture_dir: Path
) -> None:
    source = write_input(tmp_path / "in.jsonl", [{"t": 0}])
    dispatch = _LosingDispatch(agent, capture_dir, losses=99)
    async with asyncio.timeout(BOUND_S):
        summary = await collect(
            None, source, tmp_path / "o.jsonl", capture_dir=capture_dir, dispatch=dispatch
        )
    assert dispatch.seen == ["0-0", "0-0-a1"]
    assert (summary.ran, summary.lost, summary.metrics["rollouts"]) == (1, 1, 0)
    await asyncio.to_thread(dispatch.io.close)


async def test_collect_needs_one_way_to_run_rollouts(tmp_path: Path) -> None:
    source = write_input(tmp_path / "in.jsonl", [{}])

    async def dispatch(rollout: Rollout) -> RolloutOutcome:
        raise AssertionError("not called")

    with pytest.raises(ValueError, match="exactly one of agent_url and dispatch"):
        await collect(None, source, tmp_path / "o.jsonl")
    with pytest.raises(ValueError, match="exactly one of agent_url and dispatch"):
        await collect("http://127.0.0.1:9", source, tmp_path / "o.jsonl", dispatch=dispatch)
    with pytest.raises(ValueError, match="lost_retries"):
        await collect(None, source, tmp_path / "o.jsonl", dispatch=dispatch, lost_retries=-1)


@pytest.mark.parametrize(
    ("status", "error", "unreachable"),
    [
        (502, {"message": "model server connection failed", "server": "model"}, True),
        (504, {"message": "model server sent nothing", "server": "model"}, True),
        (502, {"message": "model server answered 500", "server": "model", "status": 500}, False),
        (502, {"message": "resources server down", "server": "resources"}, False),
        (500, {"message": "boom", "server": "model"}, False),
    ],
)
async def test_a_failure_says_when_the_agent_could_not_reach_its_model(
    tmp_path: Path, status: int, error: dict[str, Any], unreachable: bool
) -> None:
    async def run(request: Request) -> Response:
        return Response(orjson.dumps({"error": error}), status, media_type="application/json")

    io: BatchThread[tuple[Callable[..., Any], tuple[Any, ...]], Any] = BatchThread(call_each, "t")
    async with (
        serving(Starlette(routes=[Route("/run", run, methods=["POST"])])) as url,
        aiohttp.ClientSession() as session,
    ):
        outcome = await run_rollout(
            http_agent(session, url + "/run"), Rollout(0, 0, 0, {}), None, io
        )
    await asyncio.to_thread(io.close)
    assert outcome.kind == RolloutOutcome.FAILED
    assert outcome.model_unreachable is unreachable
    assert orjson.loads(outcome.line)["error"]["status"] == status


# -- a compressed output, and captures compacted as collection goes ---------------------------


async def test_a_zst_output_is_frames_and_its_side_files_are_named_as_a_plain_one_s(
    agent: StubAgent, tmp_path: Path, capture_dir: Path
) -> None:
    tasks: list[dict[str, Any]] = [{"calls": 2}, {"fail": "http500"}, {"calls": 1}]
    source = write_input(tmp_path / "in.jsonl", tasks)
    output = tmp_path / "out.jsonl.zst"
    async with asyncio.timeout(BOUND_S):
        summary = await collect(agent.url, source, output, capture_dir=capture_dir, num_repeats=2)
    lines = read_frame_lines(output)
    assert _keys(lines) == [(0, 0), (0, 1), (2, 0), (2, 1)]
    assert [line[CAPTURE_KEY]["metrics"]["num_calls"] for line in lines] == [2, 2, 1, 1]
    assert summary.output_path == output
    assert summary.failures_path == tmp_path / "out_failures.jsonl"
    assert summary.metrics_path == tmp_path / "out_aggregate_metrics.json"
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "in.jsonl",
        "model-calls",
        "out.jsonl.zst",
        "out_aggregate_metrics.json",
        "out_dispatched.jsonl",
        "out_failures.jsonl",
        "out_status.json",
    ]
    # The side files are plain.
    assert sorted(line["rollout_id"] for line in read_lines(summary.failures_path)) == [
        "1-0",
        "1-1",
    ]
    assert len(read_lines(dispatched_path(output))) == 6
    metrics = orjson.loads(summary.metrics_path.read_bytes())[0]["agent_metrics"]
    assert (metrics["rollouts"], metrics["failures"]) == (4, 2)


def _frame_per_line(output: Path) -> list[bytes]:
    """Rewrite the compressed output as one frame per line, as a run killed before its end
    leaves it (a frame per flushed batch); the frames, in order."""
    frames = [
        encode_frame(line)
        for part in read_frames_whole(output)
        for line in part.splitlines(keepends=True)
    ]
    output.write_bytes(b"".join(frames))
    return frames


async def test_resume_cuts_a_last_frame_cut_short_and_runs_its_rollouts_again(
    agent: StubAgent, tmp_path: Path, capture_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = write_input(tmp_path / "in.jsonl", [{"t": i, "calls": 1} for i in range(3)])
    output = tmp_path / "out.jsonl.zst"
    async with asyncio.timeout(BOUND_S):
        await collect(agent.url, source, output, capture_dir=capture_dir)
    frames = _frame_per_line(output)
    kept = len(frames[0]) + len(frames[1])
    with open(output, "r+b") as handle:
        handle.truncate(kept + len(frames[2]) // 2)  # killed in the middle of the last write
    async with asyncio.timeout(BOUND_S):
        summary = await collect(agent.url, source, output, capture_dir=capture_dir, resume=True)
    assert (summary.skipped, summary.ran) == (2, 1)
    assert (
        f"cut a last frame cut short ({len(frames[2]) // 2} bytes from byte {kept})" in caplog.text
    )
    lines = read_frame_lines(output)
    # The cut rollout was dispatched (journaled): it runs again under its next attempt.
    assert [line["rollout_id"] for line in lines] == ["0-0", "1-0", "2-0-a1"]
    assert lines[2][CAPTURE_KEY]["metrics"]["num_calls"] == 1


async def test_resume_refuses_a_zst_output_with_a_frame_that_does_not_decode(
    agent: StubAgent, tmp_path: Path, capture_dir: Path
) -> None:
    source = write_input(tmp_path / "in.jsonl", [{"t": i} for i in range(4)])
    output = tmp_path / "out.jsonl.zst"
    async with asyncio.timeout(BOUND_S):
        await collect(agent.url, source, output, capture_dir=capture_dir)
    frames = _frame_per_line(output)
    damaged = bytearray(b"".join(frames[:3]))
    damaged[len(frames[0]) + len(frames[1]) - 1] ^= 0xFF  # the second frame's checksum
    output.write_bytes(damaged[: -len(frames[2]) // 2])  # and a torn last frame behind it
    before = output.read_bytes()
    runs = len(agent.runs)
    with pytest.raises(CompressedFileError) as caught:
        async with asyncio.timeout(BOUND_S):
            await collect(agent.url, source, output, capture_dir=capture_dir, resume=True)
    assert (caught.value.path, caught.value.offset) == (output, len(frames[0]))
    assert str(caught.value).startswith(f"{output}: byte {len(frames[0])}: the frame does not")
    assert output.read_bytes() == before  # not even the torn frame cut
    assert len(agent.runs) == runs


async def test_compaction_leaves_compressed_captures_and_the_same_lines(
    agent: StubAgent, tmp_path: Path, capture_dir: Path
) -> None:
    tasks: list[dict[str, object]] = [{"calls": 1 + i, "observe": True} for i in range(3)]
    tasks += [
        {"calls": 1, "damage": True},
        {"calls": 2, "fail": "http500"},
    ]  # a failed rollout's calls are compacted too
    source = write_input(tmp_path / "in.jsonl", tasks)
    async with asyncio.timeout(BOUND_S):
        plain = await collect(agent.url, source, tmp_path / "plain.jsonl", capture_dir=capture_dir)
        assert agent.store.rollout_ids(compressed=True) == []
        packed = await collect(
            agent.url, source, tmp_path / "packed.jsonl", capture_dir=capture_dir,
            compress_capture_level=7,
        )  # fmt: skip
    ids = ["0-0", "1-0", "2-0", "3-0", "4-0"]
    names = sorted(name for name in os.listdir(capture_dir) if ".capture." in name)
    assert names == sorted([f"{i}.capture.jsonl.zst" for i in ids] + ["3-0.capture.incomplete"])
    assert agent.store.rollout_ids(compressed=False) == []
    before, after = read_lines(plain.output_path), read_lines(packed.output_path)
    assert [line[CAPTURE_KEY] for line in after] == [line[CAPTURE_KEY] for line in before]
    assert [line[TRAJECTORY_KEY] for line in after] == [line[TRAJECTORY_KEY] for line in before]
    assert [len(agent.store.read_available(i).records) for i in ids] == [1, 2, 3, 1, 2]
    assert packed.failed == 1


async def test_a_compression_level_out_of_range_is_refused_before_anything_runs(
    agent: StubAgent, tmp_path: Path, capture_dir: Path
) -> None:
    source = write_input(tmp_path / "in.jsonl", [{"calls": 1}])
    for level in (0, 23):
        with pytest.raises(ValueError, match="compression level is an int from 1 to 22"):
            await collect(
                agent.url, source, tmp_path / "o.jsonl", capture_dir=capture_dir,
                compress_capture_level=level,
            )  # fmt: skip
    assert agent.runs == []
    assert not (tmp_path / "o.jsonl").exists()


async def test_a_compaction_that_fails_is_a_warning_and_the_rollout_stands(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CaptureStore(tmp_path / "calls")
    rollout = Rollout(0, 0, 0, {})
    packed = Path(f"{store.path_for(rollout.rollout_id)}.zst")

    async def agent(body: bytes) -> tuple[int, bytes]:
        store.append(rollout.rollout_id, fake_record(rollout.rollout_id, 0))
        # A compressed file that disagrees with the plain one: compaction must refuse.
        packed.write_bytes(encode_frame(b'{"other": true}\n'))
        return 200, orjson.dumps({"response": {}, "reward": 1.0})

    io: BatchThread[tuple[Callable[..., Any], tuple[Any, ...]], Any] = BatchThread(call_each, "t")
    compactor = CaptureCompactor(store, 3)
    outcome = await run_rollout(agent, rollout, store, io, compactor=compactor)
    await asyncio.to_thread(io.close)
    await asyncio.to_thread(compactor.close)
    assert outcome.kind == RolloutOutcome.OK
    assert orjson.loads(outcome.line)["reward"] == 1.0
    assert "rollout 0-0: its capture was not compacted (CaptureConflictError" in caplog.text
    assert store.path_for(rollout.rollout_id).exists()
    store.close()


async def test_a_line_left_to_the_writer_is_the_json_object_of_the_encoded_one(
    tmp_path: Path,
) -> None:
    store = CaptureStore(tmp_path / "calls")
    rollout = Rollout(0, 0, 0, {"question": "q"})
    status = 200

    async def agent(body: bytes) -> tuple[int, bytes]:
        store.append(rollout.rollout_id, fake_record(rollout.rollout_id, 0))
        return status, orjson.dumps({"response": {}, "reward": 1.0})

    def timeless(line: Any) -> Any:
        line.get("ng_perf", {}).pop("total_latency_ms", None)  # the one figure runs differ in
        return line

    io: BatchThread[tuple[Callable[..., Any], tuple[Any, ...]], Any] = BatchThread(call_each, "t")
    lines = []
    for encode in (True, False):
        store.reset(rollout.rollout_id)
        lines.append(await run_rollout(agent, rollout, store, io, encode=encode))
    status = 500
    failed = await run_rollout(agent, rollout, store, io, encode=False)
    await asyncio.to_thread(io.close)
    encoded, left = lines
    assert (encoded.value, left.line) == (None, b"")
    assert left.value is not None
    assert left.value["ng_model_call_capture"]["calls"]
    assert timeless(orjson.loads(encoded.line)) == timeless(orjson.loads(orjson.dumps(left.value)))
    assert (failed.kind, failed.line) == (RolloutOutcome.FAILED, b"")
    assert failed.value is not None
    assert failed.value["error"]["status"] == 500
    store.close()
