"""The run's aggregate metrics: None-aware sums, latency percentiles."""

from __future__ import annotations

from typing import Any

from rollcap.collect import (
    CAPTURE_KEY,
    MetricsAccumulator,
    percentile,
)


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
