"""The pure parts: planning, resume bookkeeping, lines, trajectory, aggregate metrics."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from rollcap.attachment import build_attachment
from rollcap.collect import (
    CAPTURE_KEY,
    TRAJECTORY_KEY,
    AgentAnswerError,
    InputError,
    MetricsAccumulator,
    ProjectionError,
    ResumeState,
    Rollout,
    aggregate_metrics_path,
    check_agent_answer,
    count_tasks,
    failure_line,
    failures_path,
    iter_tasks,
    percentile,
    plan_rollouts,
    planned_count,
    project_trajectory,
    rollout_line,
    with_trajectory,
)
from rollcap.records import GAP_TRAJECTORY_PROJECTION_FAILED, ModelCallRecord
from tests.collect.conftest import fake_record

LINES = [b'{"q": 0}\n', b"\n", b'{"q": 1}\n', b"   \n", b'{"q": 2}\n']


def test_iter_tasks_skips_blank_lines_and_applies_limit() -> None:
    assert list(iter_tasks(LINES)) == [{"q": 0}, {"q": 1}, {"q": 2}]
    assert list(iter_tasks(LINES, limit=2)) == [{"q": 0}, {"q": 1}]
    assert list(iter_tasks(LINES, limit=0)) == []
    assert count_tasks(LINES, limit=10) == 3


def test_iter_tasks_is_lazy() -> None:
    def lines() -> Any:
        yield b'{"q": 0}'
        raise AssertionError("read past the limit")

    assert list(iter_tasks(lines(), limit=1)) == [{"q": 0}]


@pytest.mark.parametrize(("line", "reason"), [(b"{oops", "not valid JSON"), (b"[1]", "a list")])
def test_bad_input_line_names_its_number(line: bytes, reason: str) -> None:
    with pytest.raises(InputError, match=reason) as info:
        count_tasks([b'{"q": 0}', b"", line])
    assert info.value.line_number == 3


def test_plan_expands_repeats_in_order() -> None:
    plan = list(plan_rollouts(iter_tasks(LINES, limit=2), num_repeats=3))
    assert [(r.task_index, r.rollout_index, r.attempt_index) for r in plan] == [
        (0, 0, 0),
        (0, 1, 0),
        (0, 2, 0),
        (1, 0, 0),
        (1, 1, 0),
        (1, 2, 0),
    ]
    assert plan[4].task == {"q": 1}
    assert plan[4].run_body() == {
        "q": 1,
        "_ng_task_index": 1,
        "_ng_rollout_index": 1,
        "_ng_attempt_index": 0,
    }
    with pytest.raises(ValueError, match="num_repeats"):
        list(plan_rollouts([{}], num_repeats=0))


def _line(task: int, rollout: int, attempt: int = 0) -> bytes:
    return orjson.dumps(
        {"_ng_task_index": task, "_ng_rollout_index": rollout, "_ng_attempt_index": attempt}
    )


def test_resume_state_counts_attempts() -> None:
    state = ResumeState.from_files(
        output_lines=[_line(0, 0), _line(1, 0, 1), b'{"_ng_task_index": 2, "_ng_rol'],
        failure_lines=[_line(1, 0), _line(2, 0), _line(2, 0, 1), b"garbage"],
        capture_names=[
            "0-0.capture.jsonl",  # finished: not an attempt to count
            "3-0.capture.jsonl",  # dispatched, never finished
            "4-1-a2.capture.incomplete",
            "notes.txt",
        ],
    )
    assert state.finished == {(0, 0), (1, 0)}
    assert state.bad_output_lines == 1
    assert state.attempts == {(2, 0): 2, (3, 0): 1, (4, 1): 3}
    tasks = [{"t": i} for i in range(5)]
    plan = list(plan_rollouts(tasks, num_repeats=2, resume=state))
    assert [r.rollout_id for r in plan] == [
        "0-1",
        "1-1",
        "2-0-a2",
        "2-1",
        "3-0-a1",
        "3-1",
        "4-0",
        "4-1-a3",
    ]
    assert planned_count(5, 2, state) == (8, 2)
    assert planned_count(1, 1, state) == (0, 1)


def test_side_file_names() -> None:
    assert str(failures_path("/r/mcqa_rollouts.jsonl")) == "/r/mcqa_rollouts_failures.jsonl"
    assert str(aggregate_metrics_path("/r/out.jsonl")) == "/r/out_aggregate_metrics.json"


ROLLOUT = Rollout(3, 1, 1, {"question": "q?", "reward": "task's", "_ng_task_index": 99})


def test_rollout_line_key_order_and_reserved_keys() -> None:
    answer = {"reward": 0.5, "rollout_id": "spoof", "response": {"text": "A"}, "extra": 1}
    line = rollout_line(ROLLOUT, answer, {CAPTURE_KEY: {"x": 1}, TRAJECTORY_KEY: {"y": 2}})
    assert list(line) == [
        "question",
        "_ng_task_index",
        "_ng_rollout_index",
        "_ng_attempt_index",
        "rollout_id",
        "response",
        "reward",
        "extra",
        CAPTURE_KEY,
        TRAJECTORY_KEY,
    ]
    assert line["rollout_id"] == "3-1-a1"
    assert line["_ng_task_index"] == 3
    assert line["reward"] == 0.5
    assert line["response"] == {"text": "A"}


def test_failure_line() -> None:
    line = failure_line(ROLLOUT, "agent_error", "HTTP 500", status=500)
    assert line == {
        "_ng_task_index": 3,
        "_ng_rollout_index": 1,
        "_ng_attempt_index": 1,
        "rollout_id": "3-1-a1",
        "error": {"kind": "agent_error", "message": "HTTP 500", "status": 500},
    }


@pytest.mark.parametrize(
    "answer",
    [
        [],
        {"reward": 1.0},
        {"response": 1},
        {"response": 1, "reward": True},
        {"response": 1, "reward": "1"},
    ],
)
def test_check_agent_answer_refuses(answer: Any) -> None:
    with pytest.raises(AgentAnswerError):
        check_agent_answer(answer)


def _attachment(*records: dict[str, Any]) -> dict[str, Any]:
    calls = [ModelCallRecord.from_raw(raw, i) for i, raw in enumerate(records)]
    return build_attachment("3-1-a1", calls)


def test_with_trajectory_moves_payloads_into_the_trajectory() -> None:
    raws = [fake_record("3-1-a1", 0), fake_record("3-1-a1", 1)]
    attachment = _attachment(*raws)
    metrics = dict(attachment["metrics"])
    before = copy.deepcopy(attachment)
    out = with_trajectory(ROLLOUT, attachment)
    assert attachment == before  # the payloads moved in the line, not in the argument
    capture, trajectory = out[CAPTURE_KEY], out[TRAJECTORY_KEY]
    assert capture["metrics"] == metrics
    assert "gaps" not in capture
    for call in capture["calls"]:
        assert not {"request", "response", "request_raw", "response_raw"} & set(call)
    assert trajectory["schema_version"] == 1
    assert (trajectory["task_index"], trajectory["rollout_id"]) == (3, "3-1-a1")
    assert [c["call_index"] for c in trajectory["calls"]] == [0, 1]
    step = trajectory["calls"][1]
    assert step["request"] == raws[1]["request"]
    assert step["response"] == raws[1]["response"]
    assert step["response_metadata"] == {
        "id": "resp_3-1-a1_1",
        "model": "fake-model-2025",
        "status": "completed",
        "status_code": 200,
        "finish_reason": None,
    }
    assert step["tokens"] == {
        "tokens_in": 11,
        "tokens_out": 5,
        "tokens_reasoning": None,
        "tokens_total": 16,
        "cached_tokens": None,
    }


def test_with_trajectory_keeps_payloads_when_projection_fails() -> None:
    attachment = _attachment(fake_record("3-1-a1", 0, request=False))
    out = with_trajectory(ROLLOUT, attachment)
    assert TRAJECTORY_KEY not in out
    capture = out[CAPTURE_KEY]
    assert capture["gaps"][-1]["code"] == GAP_TRAJECTORY_PROJECTION_FAILED
    assert capture["calls"][0]["response"]["id"] == "resp_3-1-a1_0"
    assert "request" in capture["calls"][0]


def test_projection_orders_calls_and_refuses_duplicates() -> None:
    a = ModelCallRecord.from_raw(fake_record("x", 0), 0).to_dict()
    b = ModelCallRecord.from_raw(fake_record("x", 1), 1).to_dict()
    assert [c["call_index"] for c in project_trajectory(ROLLOUT, [b, a])["calls"]] == [0, 1]
    with pytest.raises(ProjectionError, match="two calls"):
        project_trajectory(ROLLOUT, [a, a])
    raw_only = dict(a, request=None, request_raw="not json")
    assert project_trajectory(ROLLOUT, [raw_only])["calls"][0]["request_raw"] == "not json"


def test_percentile() -> None:
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.5
    assert percentile(values, 90) == 90.1
    assert percentile(values, 99) == 99.01


def _metrics_line(reward: float, **metrics: Any) -> dict[str, Any]:
    return {"reward": reward, CAPTURE_KEY: {"metrics": metrics, "calls": [{"request": "x" * 10}]}}


def test_accumulator_is_none_aware() -> None:
    acc = MetricsAccumulator(capture=True)
    acc.add_line(
        _metrics_line(1.0, num_calls=2, tokens_in=10, tokens_reasoning=None, latency_total_ms=30.0)
    )
    acc.add_line(_metrics_line(0.0, num_calls=0, tokens_in=None, latency_total_ms=None))
    acc.add_line(_metrics_line(0.5, num_calls=1, tokens_in=5, latency_total_ms=10.0))
    acc.add_failure(2)
    out = acc.result()
    assert out["mean_reward"] == 0.5
    assert (out["rollouts"], out["failures"], out["num_calls"]) == (3, 2, 3)
    assert out["rollouts_without_calls"] == 1
    assert out["tokens_in"] == 15
    assert out["tokens_reasoning"] is None
    assert out["latency_total_ms"] == 40.0
    assert out["latency_p50_ms"] == 20.0


def test_accumulator_without_capture_reports_unknown_calls() -> None:
    acc = MetricsAccumulator(capture=False)
    acc.add_line({"reward": 1})
    out = acc.result()
    assert out["mean_reward"] == 1.0
    assert out["num_calls"] is None
    assert out["rollouts_without_calls"] is None
    assert out["latency_p99_ms"] is None
    assert MetricsAccumulator(capture=True).result()["mean_reward"] is None
