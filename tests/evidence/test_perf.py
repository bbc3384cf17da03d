from __future__ import annotations

from typing import Any

import orjson
import pytest

from rollcap.evidence import (
    aggregate_metrics_entry,
    aggregate_request_row,
    attach_ng_perf,
    build_ng_perf,
    perf_summary,
)
from rollcap.evidence._perf import percentile
from tests.evidence.conftest import JUDGE, POLICY, call_id


def model_call(n: int, server: dict[str, str] = POLICY, **tokens: int) -> dict[str, Any]:
    return {
        "model_call_id": call_id(n),
        "response_metadata": {"model_ref": server, "response_id": f"resp_{n}"},
        "token_stats": tokens,
    }


def inv(invocation_id: str, *refs: dict[str, Any]) -> dict[str, Any]:
    return {"invocation_id": invocation_id, "model_calls": list(refs)}


def turn(invocation_id: str, turn_no: int) -> dict[str, Any]:
    return {
        "invocation_id": invocation_id,
        "task_id": "t",
        "rollout_id": "r",
        "turn_no": turn_no,
        "timestamp": 0.0,
    }


def trajectory(**fields: Any) -> dict[str, Any]:
    return {"ng_trajectory": {"task_id": "t", "rollout_id": "r", **fields}}


def test_ng_perf_by_hand() -> None:
    result = trajectory(
        invocations=[
            # root: two turns; owns calls 0 and 1 (by id, and by server + response id).
            inv(
                "root",
                {"model_call_id": call_id(0)},
                {"model_ref": POLICY, "response_id": "resp_1"},
            ),
            # sub: no turns, owns call 2, names call 0 again (counted once, for root).
            inv("sub", {"model_call_id": call_id(2)}, {"model_call_id": call_id(0)}),
            # idle: no turns, no calls: still one turn.
            inv("idle", {"model_call_id": "nowhere"}),
        ],
        turns=[turn("root", 1), turn("root", 2), turn("ghost", 1)],
        model_calls=[
            model_call(0, prompt_tokens=10, completion_tokens=4, cached_tokens=2),
            model_call(1, prompt_tokens=20, completion_tokens=6, reasoning_tokens=3),
            model_call(2, JUDGE, prompt_tokens=5),
            model_call(3, prompt_tokens=1000),  # owned by nobody: not summed
        ],
        tool_calls=[
            {"invocation_id": "root", "tool_call_id": "a"},
            {"invocation_id": "sub", "tool_call_id": "b"},
            {"invocation_id": "orphan", "tool_call_id": "c"},
        ],
    )
    perf = build_ng_perf(result, 1234.5)
    # num_turns: root 2 turns + sub 1 owned call + idle 1 = 4; owned calls 3 -> 3/4.
    assert perf == {
        "num_turns": 4,
        "num_tool_calls": 2,
        "token_observability_coverage": 0.75,
        "prompt_tokens": 35,
        "cached_prompt_tokens": 2,
        "completion_tokens": 10,
        "reasoning_tokens": 3,
        "total_latency_ms": 1234.5,
    }
    assert list(perf) == [
        "num_turns",
        "num_tool_calls",
        "token_observability_coverage",
        "prompt_tokens",
        "cached_prompt_tokens",
        "completion_tokens",
        "reasoning_tokens",
        "total_latency_ms",
    ]


def test_coverage_is_a_float_capped_at_one_and_unknown_sums_are_absent() -> None:
    result = trajectory(
        invocations=[inv("root", {"model_call_id": call_id(0)}, {"model_call_id": call_id(1)})],
        turns=[turn("root", 1)],
        model_calls=[model_call(0), model_call(1)],
    )
    perf = build_ng_perf(result, None)
    assert perf == {"num_turns": 1, "num_tool_calls": 0, "token_observability_coverage": 1.0}
    assert (
        orjson.dumps(perf)
        == b'{"num_turns":1,"num_tool_calls":0,"token_observability_coverage":1.0}'
    )
    ambiguous = trajectory(
        invocations=[inv("root", {"model_ref": POLICY, "response_id": "resp_0"})],
        model_calls=[
            model_call(0),
            {**model_call(1), "response_metadata": {"model_ref": POLICY, "response_id": "resp_0"}},
        ],
    )
    perf = build_ng_perf(ambiguous, True)
    assert perf is not None
    assert perf["token_observability_coverage"] == 0.0
    assert "total_latency_ms" not in perf


def test_no_perf_without_a_valid_trajectory_with_invocations() -> None:
    assert build_ng_perf({}, 1.0) is None
    assert build_ng_perf(trajectory(), 1.0) is None
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        build_ng_perf(trajectory(turns=[turn("x", 0)]), 1.0)
    result: dict[str, Any] = trajectory(turns=[turn("x", 0)])
    attach_ng_perf(result, True, 1.0)  # swallowed
    assert "ng_perf" not in result
    result = trajectory(invocations=[inv("root")])
    attach_ng_perf(result, False, 1.0)
    assert "ng_perf" not in result
    attach_ng_perf(result, True, 2.5)
    assert result["ng_perf"] == {
        "num_turns": 1,
        "num_tool_calls": 0,
        "token_observability_coverage": 0.0,
        "total_latency_ms": 2.5,
    }


def test_perf_summary_by_hand() -> None:
    records = [
        {
            "num_turns": 1,
            "token_observability_coverage": 1.0,
            "prompt_tokens": 10,
            "completion_tokens": 4,
            "total_latency_ms": 100.0,
        },
        {
            "num_turns": 2,
            "token_observability_coverage": 0.0,
            "prompt_tokens": 20,
            "total_latency_ms": 200.0,
        },
        {
            "num_turns": 4,
            "token_observability_coverage": 0.5,
            "completion_tokens": 10,
            "total_latency_ms": 400.0,
        },
    ]
    summary = perf_summary(records, 4)
    assert summary == {
        "overall_observability_coverage": 0.75,
        "token_observability_coverage": 0.5,
        "mean_prompt_tokens": 15.0,
        "median_prompt_tokens": 15.0,
        "total_prompt_tokens": 30,
        "mean_completion_tokens": 7.0,
        "median_completion_tokens": 7.0,
        "total_completion_tokens": 14,
        "mean_num_turns": 7 / 3,
        "median_num_turns": 2,
        "std_num_turns": pytest.approx(1.247219128924647),
        "min_num_turns": 1,
        "p90_num_turns": 3.6,  # 2 + 0.8 * (4 - 2)
        "max_num_turns": 4,
        "mean_tokens_per_turn": 3.25,  # (4/1 + 10/4) / 2
        "median_tokens_per_turn": 3.25,
        "total_latency_p50_ms": 200.0,
        "total_latency_p90_ms": 360.0,
        "total_latency_p99_ms": 396.0,
        "total_latency_mean_ms": pytest.approx(700 / 3),
    }
    assert type(summary["median_num_turns"]) is int
    assert type(summary["total_prompt_tokens"]) is int
    assert list(summary)[:5] == [
        "overall_observability_coverage",
        "token_observability_coverage",
        "mean_prompt_tokens",
        "median_prompt_tokens",
        "total_prompt_tokens",
    ]


def test_perf_summary_is_null_without_records_or_rollouts() -> None:
    assert perf_summary([], 3) is None
    assert perf_summary([{"num_turns": 1}], 0) is None
    assert perf_summary([{}], 2) == {
        "overall_observability_coverage": 0.5,
        "token_observability_coverage": 0.0,
    }


@pytest.mark.parametrize(
    "values",
    [[1], [3, 1], [1, 2, 3, 4, 5], [0.1, 0.7, 0.2, 1e9, 3.3, 2.25, 8.0], list(range(17))],
)
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_percentile_matches_numpy_linear(values: list[float], q: float) -> None:
    numpy = pytest.importorskip("numpy")
    assert percentile(values, q) == float(numpy.percentile(values, q * 100))
    assert type(percentile(values, q)) is float


def test_aggregate_request_row_drops_evidence_and_payloads_but_keeps_perf() -> None:
    result = {
        "reward": 1.0,
        "response": {"output": ["big"], "usage": {"input_tokens": 3}, "incomplete_details": None},
        "responses_create_params": {"input": "x"},
        "ng_agent_observations": {},
        "ng_model_call_capture": {},
        "ng_trajectory": {},
        "ng_perf": {"num_turns": 1},
        "_ng_task_index": 0,
    }
    assert aggregate_request_row(result) == {
        "reward": 1.0,
        "ng_perf": {"num_turns": 1},
        "_ng_task_index": 0,
        "response": {"usage": {"input_tokens": 3}},
    }
    assert "response" not in aggregate_request_row({"response": {"output": []}})


def test_aggregate_metrics_entry_shape() -> None:
    common: dict[str, Any] = {
        "agent_name": "simple_agent",
        "environment_server": "mcqa",
        "agent_metrics": {"mean/reward": 1.0},
        "key_metrics": {},
        "group_level_metrics": [],
        "repeat_level_metrics": [],
    }
    entry = aggregate_metrics_entry(**common, perf_summary={"overall_observability_coverage": 1.0})
    assert list(entry) == [
        "agent_ref",
        "_ng_environment_server",
        "agent_metrics",
        "key_metrics",
        "group_level_metrics",
        "repeat_level_metrics",
        "perf_summary",
    ]
    assert entry["agent_ref"] == {"name": "simple_agent"}
    assert "perf_summary" not in aggregate_metrics_entry(**common, perf_summary=None)
