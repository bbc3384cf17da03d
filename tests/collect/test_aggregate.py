"""The run's aggregate metrics: None-aware sums, latency percentiles, one entry per server."""

from __future__ import annotations

from typing import Any

from rollcap.collect import (
    AggregateMetrics,
    MetricsAccumulator,
    percentile,
)
from rollcap.evidence import CAPTURE_KEY, perf_summary


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


def _line(task: int, repeat: int, reward: float, **extra: Any) -> dict[str, Any]:
    return {"_ng_task_index": task, "_ng_rollout_index": repeat, "reward": reward, **extra}


def test_one_entry_per_environment_server_in_the_order_first_seen() -> None:
    acc = AggregateMetrics(capture=False)
    perf = [
        {"num_turns": 3, "num_tool_calls": 2, "token_observability_coverage": 1.0},
        {"num_turns": 1, "num_tool_calls": 0, "token_observability_coverage": 0.5},
    ]
    acc.add_line(_line(0, 0, 1.0, _ng_environment_server="b", ng_perf=perf[0]))
    acc.add_line(_line(0, 1, 0.0, _ng_environment_server="b", ng_perf=perf[1]))
    acc.add_line(_line(1, 0, 0.5, _ng_environment_server="b"))
    acc.add_line(_line(2, 0, 1.0, _ng_environment_server={"name": "a"}))
    acc.add_failure("b", 2)
    b, a = acc.entries("agent7")
    assert (b["_ng_environment_server"], a["_ng_environment_server"]) == ("b", {"name": "a"})
    assert b["agent_ref"] == a["agent_ref"] == {"name": "agent7"}
    assert (b["agent_metrics"]["rollouts"], b["agent_metrics"]["failures"]) == (3, 2)
    assert b["key_metrics"] == {"mean/reward": 0.5}
    assert b["group_level_metrics"] == [
        {
            "_ng_task_index": 0,
            "rollouts": 2,
            "mean/reward": 0.5,
            "min/reward": 0.0,
            "max/reward": 1.0,
        },
        {
            "_ng_task_index": 1,
            "rollouts": 1,
            "mean/reward": 0.5,
            "min/reward": 0.5,
            "max/reward": 0.5,
        },
    ]
    assert b["repeat_level_metrics"] == [
        {
            "_ng_rollout_index": 0,
            "rollouts": 2,
            "mean/reward": 0.75,
            "min/reward": 0.5,
            "max/reward": 1.0,
        },
        {
            "_ng_rollout_index": 1,
            "rollouts": 1,
            "mean/reward": 0.0,
            "min/reward": 0.0,
            "max/reward": 0.0,
        },
    ]
    # Three rollouts, two of them with ng_perf: the summary says so.
    assert b["perf_summary"] == perf_summary(perf, 3)
    assert b["perf_summary"]["overall_observability_coverage"] == 2 / 3
    assert "perf_summary" not in a  # no rollout of it has ng_perf
    assert acc.overall.result()["rollouts"] == 4
    assert acc.overall.result()["failures"] == 2


def test_no_rollout_at_all_is_one_entry_without_a_server() -> None:
    acc = AggregateMetrics(capture=True)
    acc.add_failure(None, 1)
    (entry,) = acc.entries("agent")
    assert entry["_ng_environment_server"] is None
    assert entry["agent_metrics"]["failures"] == 1
    assert entry["key_metrics"] == {"mean/reward": None}
    assert entry["group_level_metrics"] == entry["repeat_level_metrics"] == []
