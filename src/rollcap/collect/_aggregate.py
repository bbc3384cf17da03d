"""Aggregate metrics of a collection, from the rollout lines' metrics only (pure).

Only each line's ``reward`` and ``ng_model_call_capture.metrics`` are read, never the calls or
the trajectory, so the cost per rollout is a few numbers whatever the payloads weigh. Totals
follow ``rollcap.metrics``: known values are summed, and a total nothing reports is ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rollcap.collect._lines import CAPTURE_KEY
from rollcap.metrics import METRIC_KEYS

__all__ = ["CollectionSummary", "MetricsAccumulator", "percentile"]

_TOKEN_KEYS = tuple(key for key in METRIC_KEYS if key not in ("latency_total_ms", "num_calls"))


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) by linear interpolation between ranks; ``None`` if empty."""
    if not sorted_values:
        return None
    position = (len(sorted_values) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    value = sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)
    return round(value, 2)


@dataclass(frozen=True, slots=True)
class CollectionSummary:
    """What a collection produced; ``metrics`` is what ``..._aggregate_metrics.json`` holds.

    ``rollouts`` counts the output file's lines (earlier runs' included when resuming),
    ``ran`` and ``failed`` this run's rollouts, ``skipped`` those an earlier run finished.
    ``lost``: this run's rollouts written nowhere because what ran them died (collection across
    a cluster); ``--resume`` runs them again.
    """

    output_path: Path
    failures_path: Path
    metrics_path: Path
    total: int
    ran: int
    failed: int
    skipped: int
    metrics: Mapping[str, Any]
    lost: int = 0

    @property
    def mean_reward(self) -> float | None:
        value = self.metrics["mean_reward"]
        return None if value is None else float(value)

    @property
    def rollouts_without_calls(self) -> int | None:
        """With capture on, how many rollouts captured no model call; ``None`` with it off."""
        value = self.metrics["rollouts_without_calls"]
        return None if value is None else int(value)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("output_path", "failures_path", "metrics_path"):
            out[key] = str(out[key])
        return out


class MetricsAccumulator:
    """Feed rollout lines one at a time; ``result()`` is the aggregate-metrics object.

    Holds one float per rollout (its model latency, for the percentiles) and nothing else that
    grows with the collection.
    """

    def __init__(self, *, capture: bool) -> None:
        self.capture = capture
        self.rollouts = 0
        self.failures = 0
        self._reward_sum = 0.0
        self._without_calls = 0
        self._totals: dict[str, Any] = dict.fromkeys((*_TOKEN_KEYS, "latency_total_ms"))
        self._calls = 0
        self._latencies: list[float] = []

    def add_failure(self, count: int = 1) -> None:
        self.failures += count

    def add_line(self, line: Mapping[str, Any]) -> None:
        self.rollouts += 1
        reward = line.get("reward")
        if isinstance(reward, int | float) and not isinstance(reward, bool):
            self._reward_sum += reward
        attachment = line.get(CAPTURE_KEY)
        metrics = attachment.get("metrics") if isinstance(attachment, Mapping) else None
        if not isinstance(metrics, Mapping):
            if self.capture:
                self._without_calls += 1
            return
        calls = metrics.get("num_calls")
        calls = calls if isinstance(calls, int) and not isinstance(calls, bool) else 0
        self._calls += calls
        if calls == 0:
            self._without_calls += 1
        for key in self._totals:
            value = metrics.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                total = self._totals[key]
                self._totals[key] = value if total is None else total + value
        latency = metrics.get("latency_total_ms")
        if isinstance(latency, int | float) and not isinstance(latency, bool):
            self._latencies.append(float(latency))

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mean_reward": self._reward_sum / self.rollouts if self.rollouts else None,
            "rollouts": self.rollouts,
            "failures": self.failures,
        }
        if not self.capture:
            # Without capture nothing is known about the calls: unknown, not zero.
            out["num_calls"] = None
            out["rollouts_without_calls"] = None
            out |= dict.fromkeys(self._totals)
            out |= {"latency_p50_ms": None, "latency_p90_ms": None, "latency_p99_ms": None}
            return out
        out["num_calls"] = self._calls
        out["rollouts_without_calls"] = self._without_calls
        out |= self._totals
        if out["latency_total_ms"] is not None:
            out["latency_total_ms"] = round(out["latency_total_ms"], 2)
        latencies = sorted(self._latencies)
        for q in (50, 90, 99):
            out[f"latency_p{q}_ms"] = percentile(latencies, q)
        return out
