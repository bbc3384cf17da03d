"""Aggregate metrics of a collection, from a few numbers of each rollout line (pure).

Only each line's ``reward``, indices, environment server, ``ng_model_call_capture.metrics``
and ``ng_perf`` are read, never the calls or the trajectory, so what is kept per rollout is a
few numbers whatever the payloads weigh. Totals follow ``rollcap.metrics``: known values are
summed, and a total nothing reports is ``None``.

``MetricsAccumulator`` gives rollcap's own summary of a run (reward, calls, tokens, model
latency). ``AggregateMetrics`` gives ``<stem>_aggregate_metrics.json``: a list with one entry
per environment server (``rollcap.evidence.aggregate_metrics_entry``, EVIDENCE.md section 9.3),
whose ``agent_metrics`` is that summary for the server's rollouts, ``key_metrics`` its mean
reward, ``group_level_metrics`` reward statistics per task, ``repeat_level_metrics`` per
repeat, and ``perf_summary`` the summary of the rollouts' ``ng_perf`` (section 9.2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from rollcap.evidence import CAPTURE_KEY, PERF_KEY, aggregate_metrics_entry, perf_summary
from rollcap.ids import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY
from rollcap.metrics import METRIC_KEYS

__all__ = ["AggregateMetrics", "CollectionSummary", "MetricsAccumulator", "percentile"]

ENVIRONMENT_SERVER_KEY = "_ng_environment_server"

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
    a cluster); ``--resume`` runs them again. ``metrics`` is the whole run's summary;
    ``aggregate_metrics`` what the metrics file holds, one entry per environment server.
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
    aggregate_metrics: Sequence[Mapping[str, Any]] = ()

    @property
    def perf_summary(self) -> Mapping[str, Any] | None:
        """The first environment server's ``perf_summary`` (one server in a plain run)."""
        for entry in self.aggregate_metrics:
            summary = entry.get("perf_summary")
            if isinstance(summary, Mapping):
                return summary
        return None

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
        out["aggregate_metrics"] = list(out["aggregate_metrics"])
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


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class _RewardStats:
    """Count, sum, least and greatest of some rewards: four numbers, however many rollouts."""

    __slots__ = ("count", "high", "low", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.low = math.inf
        self.high = -math.inf

    def add(self, reward: float) -> None:
        self.count += 1
        self.total += reward
        self.low = min(self.low, reward)
        self.high = max(self.high, reward)

    def summary(self) -> dict[str, Any]:
        if not self.count:
            return {"rollouts": 0, "mean/reward": None, "min/reward": None, "max/reward": None}
        return {
            "rollouts": self.count,
            "mean/reward": self.total / self.count,
            "min/reward": self.low,
            "max/reward": self.high,
        }


class _ServerAggregate:
    """What one environment server's entry is made from."""

    def __init__(self, environment_server: Any, *, capture: bool) -> None:
        self.environment_server = environment_server
        self.metrics = MetricsAccumulator(capture=capture)
        self.tasks: dict[Any, _RewardStats] = {}
        self.repeats: dict[Any, _RewardStats] = {}
        self.perf: list[dict[str, Any]] = []

    def add_line(self, line: Mapping[str, Any]) -> None:
        self.metrics.add_line(line)
        reward = line.get("reward")
        if isinstance(reward, int | float) and not isinstance(reward, bool):
            for key, groups in ((TASK_INDEX_KEY, self.tasks), (ROLLOUT_INDEX_KEY, self.repeats)):
                group = line.get(key)
                if group is not None and not isinstance(group, dict | list):
                    groups.setdefault(group, _RewardStats()).add(float(reward))
        perf = line.get(PERF_KEY)
        if isinstance(perf, Mapping):
            # Its numbers only: what the summary reads, a few per rollout.
            self.perf.append({k: v for k, v in perf.items() if _number(v)})

    def entry(self, agent_name: str) -> dict[str, Any]:
        metrics = self.metrics.result()
        return aggregate_metrics_entry(
            agent_name=agent_name,
            environment_server=self.environment_server,
            agent_metrics=metrics,
            key_metrics={"mean/reward": metrics["mean_reward"]},
            group_level_metrics=[
                {TASK_INDEX_KEY: task, **stats.summary()} for task, stats in self.tasks.items()
            ],
            repeat_level_metrics=[
                {ROLLOUT_INDEX_KEY: repeat, **stats.summary()}
                for repeat, stats in self.repeats.items()
            ],
            perf_summary=perf_summary(self.perf, self.metrics.rollouts),
        )


class AggregateMetrics:
    """Feed rollout lines (and failures) one at a time; ``entries`` is the metrics file.

    Lines are grouped by their ``_ng_environment_server`` (absent: one group, ``null``), in
    the order the servers are first seen. Kept per rollout: its ``ng_perf`` numbers and its
    model latency; per task and per repeat: four numbers.
    """

    def __init__(self, *, capture: bool) -> None:
        self.capture = capture
        self.overall = MetricsAccumulator(capture=capture)
        self._servers: dict[bytes, _ServerAggregate] = {}

    def _server(self, environment_server: Any) -> _ServerAggregate:
        key = orjson.dumps(environment_server, option=orjson.OPT_SORT_KEYS)
        server = self._servers.get(key)
        if server is None:
            server = _ServerAggregate(environment_server, capture=self.capture)
            self._servers[key] = server
        return server

    def add_line(self, line: Mapping[str, Any]) -> None:
        self.overall.add_line(line)
        self._server(line.get(ENVIRONMENT_SERVER_KEY)).add_line(line)

    def add_failure(self, environment_server: Any = None, count: int = 1) -> None:
        self.overall.add_failure(count)
        self._server(environment_server).metrics.add_failure(count)

    def entries(self, agent_name: str) -> list[dict[str, Any]]:
        """One entry per environment server (one, for no rollout at all)."""
        if not self._servers:
            self._server(None)
        return [server.entry(agent_name) for server in self._servers.values()]
