"""``ng_perf`` per rollout, ``perf_summary`` per run, the aggregate-metrics entry (pure).

``build_ng_perf(result, rollout_latency_ms)`` reads a rollout's valid trajectory (at least one
invocation): turns per invocation, tool calls, the calls its invocations own (by key, the first
claim wins) and their token sums, and the collector's own wall-clock of the agent's run
(EVIDENCE.md section 8). ``perf_summary(records, total_rollouts)`` summarizes the ``ng_perf``
of a run's rollouts (section 9.2); ``aggregate_metrics_entry`` is one environment server's
entry of ``<stem>_aggregate_metrics.json`` (section 9.3).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from rollcap.evidence._codes import (
    CAPTURE_KEY,
    OBSERVATIONS_KEY,
    PERF_KEY,
    TRAJECTORY_KEY,
)
from rollcap.evidence._models import ModelCallRef, TrajectoryModelCall, TrajectoryRecord

__all__ = [
    "aggregate_metrics_entry",
    "aggregate_request_row",
    "attach_ng_perf",
    "build_ng_perf",
    "ng_perf_of",
    "percentile",
    "perf_summary",
]

# ng_perf key <- TrajectoryTokenStats field, summed over the owned calls.
_TOKEN_SUMS = (
    ("prompt_tokens", "prompt_tokens"),
    ("cached_prompt_tokens", "cached_tokens"),
    ("completion_tokens", "completion_tokens"),
    ("reasoning_tokens", "reasoning_tokens"),
)
_SUMMARY_TOKENS = ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "reasoning_tokens")


def _is_number(value: object) -> bool:
    # A bool passes as an int, as it does where these figures are computed elsewhere.
    return isinstance(value, int | float)


class _Positions:
    """A trajectory's model calls by call key and by response key."""

    def __init__(self, calls: Sequence[TrajectoryModelCall]) -> None:
        self._calls = calls
        self._by_id: dict[str, list[int]] = {}
        self._by_response: dict[tuple[str, str, str], list[int]] = {}
        for position, call in enumerate(calls):
            if call.model_call_id:
                self._by_id.setdefault(call.model_call_id, []).append(position)
            meta = call.response_metadata
            if meta.model_ref is not None and meta.response_id:
                key = (meta.model_ref.type, meta.model_ref.name, meta.response_id)
                self._by_response.setdefault(key, []).append(position)

    def resolve(self, ref: ModelCallRef) -> int | None:
        call_id, server, response_id = ref.key()
        if call_id:
            found = []
            for position in self._by_id.get(call_id, ()):
                meta = self._calls[position].response_metadata
                call_server = (
                    None
                    if meta.model_ref is None
                    else (
                        meta.model_ref.type,
                        meta.model_ref.name,
                    )
                )
                if (server is None or server == call_server) and (
                    response_id is None or response_id == meta.response_id
                ):
                    found.append(position)
        elif server is not None and response_id is not None:
            found = self._by_response.get((*server, response_id), [])
        else:
            found = []
        return found[0] if len(found) == 1 else None


def build_ng_perf(
    result: Mapping[str, Any], rollout_latency_ms: float | None
) -> dict[str, Any] | None:
    """The rollout's ``ng_perf``, or ``None`` without a valid trajectory with invocations.

    Raises when ``ng_trajectory`` is an object that is not a valid trajectory.
    """
    value = result.get(TRAJECTORY_KEY)
    if not isinstance(value, dict):
        return None
    return ng_perf_of(TrajectoryRecord.model_validate(value), rollout_latency_ms)


def ng_perf_of(
    trajectory: TrajectoryRecord, rollout_latency_ms: float | None
) -> dict[str, Any] | None:
    """``build_ng_perf`` of a trajectory record already made."""
    if not trajectory.invocations:
        return None
    positions = _Positions(trajectory.model_calls)
    seen: set[int] = set()
    owned: dict[str, list[int]] = {}
    for invocation in trajectory.invocations:
        mine = owned.setdefault(invocation.invocation_id, [])
        for ref in invocation.model_calls:
            position = positions.resolve(ref)
            if position is not None and position not in seen:
                seen.add(position)
                mine.append(position)
    turns_of: dict[str, int] = {}
    for turn in trajectory.turns:
        turns_of[turn.invocation_id] = turns_of.get(turn.invocation_id, 0) + 1
    num_turns = sum(
        turns_of.get(inv.invocation_id, 0) or len(owned[inv.invocation_id]) or 1
        for inv in trajectory.invocations
    )
    ids = {invocation.invocation_id for invocation in trajectory.invocations}
    perf: dict[str, Any] = {
        "num_turns": num_turns,
        "num_tool_calls": sum(1 for tool in trajectory.tool_calls if tool.invocation_id in ids),
        "token_observability_coverage": min(1.0, len(seen) / num_turns),
    }
    owned_calls = [trajectory.model_calls[p] for mine in owned.values() for p in mine]
    for key, field in _TOKEN_SUMS:
        values = [getattr(call.token_stats, field) for call in owned_calls]
        known = [v for v in values if v is not None]
        if known:
            perf[key] = sum(known)
    if _is_number(rollout_latency_ms) and not isinstance(rollout_latency_ms, bool):
        perf["total_latency_ms"] = rollout_latency_ms
    return perf


def attach_ng_perf(
    result: dict[str, Any],
    observability_enabled: bool,
    rollout_latency_ms: float | None,
    *,
    trajectory: TrajectoryRecord | None = None,
) -> None:
    """``result["ng_perf"]`` when observability is on and the trajectory allows one.

    ``trajectory``: the record ``result["ng_trajectory"]`` was dumped from, read as it is
    instead of validating the dump again.
    """
    if not observability_enabled:
        return
    try:
        if trajectory is None:
            perf = build_ng_perf(result, rollout_latency_ms)
        else:
            perf = ng_perf_of(trajectory, rollout_latency_ms)
    except Exception:  # evidence that cannot give figures gives none, and loses nothing
        return
    if perf:
        result[PERF_KEY] = perf


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), always a float."""
    ordered = sorted(values)
    index = (len(ordered) - 1) * q
    below = math.floor(index)
    above = min(below + 1, len(ordered) - 1)
    t = index - below
    a, b = float(ordered[below]), float(ordered[above])
    # numpy's lerp: from the nearer end, so the result is monotonic in t and exact at ends.
    return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t


def perf_summary(
    records: Sequence[Mapping[str, Any]], total_rollouts: int
) -> dict[str, Any] | None:
    """The run's ``perf_summary`` from its rollouts' ``ng_perf`` objects (section 9.2).

    ``None`` when there are no rollouts or none has ``ng_perf``. Missing figures are skipped,
    never counted as 0.
    """
    if total_rollouts <= 0 or not records:
        return None
    out: dict[str, Any] = {
        "overall_observability_coverage": len(records) / total_rollouts,
        "token_observability_coverage": sum(
            1
            for record in records
            if _is_number(record.get("token_observability_coverage"))
            and record["token_observability_coverage"] > 0
        )
        / total_rollouts,
    }

    def numbers(key: str) -> list[Any]:
        return [record[key] for record in records if _is_number(record.get(key))]

    for key in _SUMMARY_TOKENS:
        values = numbers(key)
        if values:
            out[f"mean_{key}"] = statistics.fmean(values)
            out[f"median_{key}"] = statistics.median(values)
            out[f"total_{key}"] = sum(values)
    turns = numbers("num_turns")
    if turns:
        out["mean_num_turns"] = statistics.fmean(turns)
        out["median_num_turns"] = statistics.median(turns)
        out["std_num_turns"] = statistics.pstdev(turns)
        out["min_num_turns"] = min(turns)
        out["p90_num_turns"] = percentile(turns, 0.9)
        out["max_num_turns"] = max(turns)
    per_turn = [
        record["completion_tokens"] / record["num_turns"]
        for record in records
        if _is_number(record.get("completion_tokens"))
        and _is_number(record.get("num_turns"))
        and record["num_turns"] > 0
    ]
    if per_turn:
        out["mean_tokens_per_turn"] = statistics.fmean(per_turn)
        out["median_tokens_per_turn"] = statistics.median(per_turn)
    latency = numbers("total_latency_ms")
    if latency:
        out["total_latency_p50_ms"] = percentile(latency, 0.5)
        out["total_latency_p90_ms"] = percentile(latency, 0.9)
        out["total_latency_p99_ms"] = percentile(latency, 0.99)
        out["total_latency_mean_ms"] = statistics.fmean(latency)
    return out


def aggregate_request_row(result: Mapping[str, Any]) -> dict[str, Any]:
    """One rollout as an aggregate-metrics request carries it (section 9.1).

    Without the payload-heavy keys; ``response`` comes back as ``{usage, incomplete_details}``
    (each only when the answer's is non-null, no ``response`` at all when both are missing).
    ``ng_perf`` and everything else stay.
    """
    dropped = ("response", "responses_create_params", OBSERVATIONS_KEY, CAPTURE_KEY, TRAJECTORY_KEY)
    row = {key: value for key, value in result.items() if key not in dropped}
    response = result.get("response")
    if isinstance(response, Mapping):
        kept = {
            key: response[key]
            for key in ("usage", "incomplete_details")
            if response.get(key) is not None
        }
        if kept:
            row["response"] = kept
    return row


def aggregate_metrics_entry(
    *,
    agent_name: str,
    environment_server: Any,
    agent_metrics: Any,
    key_metrics: Any,
    group_level_metrics: Any,
    repeat_level_metrics: Any,
    perf_summary: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """One environment server's entry of ``<stem>_aggregate_metrics.json`` (section 9.3).

    The file is a JSON list of these, written with 2-space indentation; ``perf_summary`` is
    present only when there is one.
    """
    entry: dict[str, Any] = {
        "agent_ref": {"name": agent_name},
        "_ng_environment_server": environment_server,
        "agent_metrics": agent_metrics,
        "key_metrics": key_metrics,
        "group_level_metrics": group_level_metrics,
        "repeat_level_metrics": repeat_level_metrics,
    }
    if perf_summary is not None:
        entry["perf_summary"] = dict(perf_summary)
    return entry
