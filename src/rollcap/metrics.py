"""Aggregate per-call metrics and build the rollout attachment (pure).

Aggregates follow one rule: sum the values that are known; a total no call reports is ``None``
(unknown), never 0, so a dialect that reports no reasoning tokens does not look like "zero
reasoning".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rollcap.records import ModelCallRecord

__all__ = [
    "GAP_INCOMPLETE",
    "GAP_NO_RECORDS",
    "GAP_RECORDS_UNREADABLE",
    "GAP_TRAJECTORY_PROJECTION_FAILED",
    "GAP_UNREADABLE",
    "METRIC_KEYS",
    "Gap",
    "aggregate",
    "build_attachment",
]

GAP_NO_RECORDS = "model_call_capture_no_records"
GAP_RECORDS_UNREADABLE = "model_call_capture_records_unreadable"
GAP_INCOMPLETE = "model_call_capture_incomplete"
GAP_UNREADABLE = "model_call_capture_unreadable"
GAP_TRAJECTORY_PROJECTION_FAILED = "trajectory_projection_failed"

_SUMMED = (
    "tokens_in",
    "tokens_out",
    "tokens_reasoning",
    "tokens_total",
    "cached_tokens",
    "latency_total_ms",
)
METRIC_KEYS = (*_SUMMED, "num_calls")


@dataclass(frozen=True, slots=True)
class Gap:
    """Something the attachment could not include, and why."""

    code: str
    detail: str | None = None

    def to_dict(self) -> dict[str, str]:
        return (
            {"code": self.code}
            if self.detail is None
            else {"code": self.code, "detail": self.detail}
        )


def aggregate(records: Iterable[ModelCallRecord]) -> dict[str, Any]:
    """``tokens_*``, ``cached_tokens``, ``latency_total_ms`` sums and ``num_calls``.

    ``num_calls`` counts every call, failed ones included.
    """
    totals: dict[str, Any] = dict.fromkeys(_SUMMED)
    count = 0
    for record in records:
        count += 1
        for key in _SUMMED:
            value = getattr(record, key)
            if value is not None:
                totals[key] = value if totals[key] is None else totals[key] + value
    if totals["latency_total_ms"] is not None:
        # Float sums drift (0.1 + 0.2); latencies are kept at 2 decimals everywhere.
        totals["latency_total_ms"] = round(totals["latency_total_ms"], 2)
    totals["num_calls"] = count
    return totals


def build_attachment(
    rollout_id: str,
    records: Sequence[ModelCallRecord],
    gaps: Iterable[Gap] = (),
    *,
    payloads: bool = True,
) -> dict[str, Any]:
    """The ``ng_model_call_capture`` object of one rollout; ``gaps`` is omitted when empty."""
    out: dict[str, Any] = {
        "rollout_id": rollout_id,
        "metrics": aggregate(records),
        "calls": [record.to_dict(payloads=payloads) for record in records],
    }
    gap_list = [gap.to_dict() for gap in gaps]
    if gap_list:
        out["gaps"] = gap_list
    return out
